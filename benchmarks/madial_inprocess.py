"""MADial-Bench remembered-item recall scored in process: the memory tool's ranking of a user's
items (stemmed BM25 + e5 fused as `app.recall.service.recall` fuses them, the feature rerank,
the tool's match gate) without a server, so a ranking change is measured in seconds instead of
the ~4 minutes of `contextd eval madial` per language (most of them storing the memories
under `remember`'s rate limit).

The e5 vectors (items embedded as the worker embeds them, each query view as recall embeds it)
are cached in the pickle `--cache`, so only new texts are encoded (a first run of both languages
takes ~1.5 minutes on this machine, a cached one seconds). Items are deduplicated
with the same `near_duplicate` rule `remember` applies. The sessions of the eval hold no chunks,
so only the item arms are fused here.

    .venv/bin/python -m benchmarks.madial_inprocess --data ../shared/eval/madial --lang zh

With `--other-language SHARE` each user's items are stored in the other language with that
probability (`--seed`): a bilingual user, for recall across languages.
"""

import argparse
import asyncio
import pickle
import random
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from app.agent.policy import is_match
from app.core.config import Settings
from app.domain.dates import query_date_terms
from app.domain.stem import by_stem
from app.domain.text import mostly_cjk, terms
from app.embeddings.base import Embedder, l2_normalise
from app.embeddings.factory import create_embedder
from app.eval.madial import (
    Lang,
    MadialDialogue,
    MadialMemory,
    load_madial,
    recall_at,
    split_of,
)
from app.memories.policy import embedding_text, near_duplicate
from app.recall.arms import lexical_arm
from app.recall.bm25 import BM25Index
from app.recall.fusion import ArmWeights, fuse_arms
from app.recall.hits import MEMORY_PREFIX
from app.recall.languages import calibrated
from app.recall.query import query_views, weighted_terms
from app.recall.rerank import RerankCandidate, feature_rerank
from app.recall.rewrite import rewrite_query

KS = (5, 10)
SETTINGS = Settings()


@dataclass
class Pool:
    """One user's stored items: ids (`memory:<first dataset id>`), texts, vectors, BM25."""

    ids: list[str]
    texts: dict[str, str]
    stands_for: dict[str, list[str]]
    vectors: np.ndarray
    index: BM25Index


class VectorCache:
    def __init__(self, path: Path, embedder: Embedder) -> None:
        self.path, self.embedder = path, embedder
        self.data: dict[tuple[str, str], np.ndarray] = (
            pickle.loads(path.read_bytes()) if path.exists() else {}
        )

    async def get(self, texts: Sequence[str], *, query: bool) -> np.ndarray:
        kind = "query" if query else "passage"
        missing = list(dict.fromkeys(t for t in texts if (kind, t) not in self.data))
        for start in range(0, len(missing), 16):
            batch = missing[start : start + 16]
            if query:
                out = await self.embedder.embed_queries(batch, timeout_s=None)
            else:
                out = await self.embedder.embed_passages(batch)
            self.data.update({(kind, t): v for t, v in zip(batch, out, strict=True)})
        if missing:
            self.path.write_bytes(pickle.dumps(self.data))
        return np.stack([self.data[(kind, t)] for t in texts])


def bilingual(
    memories: Sequence[MadialMemory], translations: Sequence[MadialMemory], share: float, seed: int
) -> list[MadialMemory]:
    """`memories` with each one that has a translation (MADial's two languages are translations
    of each other, ids alike) replaced by it with probability `share`: a bilingual user's items."""
    other = {m.id: m for m in translations}
    draw = random.Random(seed)
    return [other[m.id] if m.id in other and draw.random() < share else m for m in memories]


async def build_pools(memories: Sequence[MadialMemory], cache: VectorCache) -> dict[str, Pool]:
    by_user: dict[str, list[MadialMemory]] = {}
    for m in memories:
        by_user.setdefault(m.user, []).append(m)
    pools = {}
    for user, pool in by_user.items():
        texts: dict[str, str] = {}
        tags: dict[str, list[str]] = {}
        stands_for: dict[str, list[str]] = {}
        for m in pool:
            same = near_duplicate(m.text, list(texts.items()), SETTINGS.memory.dedup_jaccard)
            if same is not None:
                stands_for[same].append(m.id)
                continue
            mid = f"{MEMORY_PREFIX}{m.id}"
            texts[mid], tags[mid], stands_for[mid] = m.text, sorted(m.tags), [m.id]
        ids = list(texts)
        vectors = await cache.get([embedding_text(texts[i], tags[i]) for i in ids], query=False)
        index = BM25Index.from_term_counts([(i, by_stem(Counter(terms(texts[i])))) for i in ids])
        pools[user] = Pool(ids, texts, stands_for, vectors, index)
    return pools


def rank(
    pool: Pool,
    query: str,
    recent_turns: Sequence[str],
    qvec: np.ndarray,
    *,
    candidates: int = SETTINGS.session_defaults.recall_candidates,
) -> list[str]:
    """The memory tool's order of `pool`'s items for `query`, after its match gate."""
    rs = SETTINGS.recall
    rewritten = rewrite_query(query, recent_turns)
    query_terms = weighted_terms(query, rewritten)
    query_terms.update(dict.fromkeys(query_date_terms(query, datetime.now(UTC)), 1.0))
    # Raw BM25 scores: the relative fusion min-max normalises each arm (recall normalises the
    # items' scores beforehand only to put them next to the chunks', the same order and scale).
    lexical = lexical_arm(pool.index, query_terms, candidates)
    sims = pool.vectors @ qvec
    vector = calibrated(
        {pool.ids[i]: float(sims[i]) for i in range(len(pool.ids))},
        mostly_cjk(query),
        pool.texts,
        candidates,
    )
    fused = fuse_arms(
        exact=[],
        lexical=sorted(lexical, key=lambda d: -lexical[d]),
        vector=sorted(vector, key=lambda d: -vector[d]),
        k=rs.rrf_k,
        weights=ArmWeights(rs.weight_exact, rs.weight_lexical, rs.weight_vector),
        method=rs.fusion,
        lexical_scores=lexical,
        vector_scores=vector,
    )
    median = statistics.median(vector.values()) if vector else 0.0
    scored = feature_rerank(
        rewritten,
        [
            RerankCandidate(f.id, pool.texts[f.id], f.score, f.rank, 0, 0, ranged=False)
            for f in fused
        ],
        0,  # items have no turns: the recency feature is the same for every one
    )
    wanted = terms(query) or terms(rewritten.rewritten)
    return [
        s.id
        for s in scored
        if is_match(
            wanted,
            pool.texts[s.id],
            exact_hit=False,
            vector_margin=vector[s.id] - median if s.id in vector else None,
        )
    ]


async def query_vectors(
    dialogues: Sequence[MadialDialogue],
    cache: VectorCache,
    views_of: Callable[[str], list[str]] = query_views,
) -> list[np.ndarray]:
    views = [views_of(d.query) for d in dialogues]
    flat = await cache.get([v for vs in views for v in vs], query=True)
    out, at = [], 0
    for vs in views:
        out.append(l2_normalise(flat[at : at + len(vs)].mean(axis=0, keepdims=True))[0])
        at += len(vs)
    return out


def score(
    pools: dict[str, Pool], dialogues: Sequence[MadialDialogue], qvecs: Sequence[np.ndarray]
) -> dict[str, dict[int, float]]:
    """R@k per split ("all", "tune", "check")."""
    per: dict[str, list[dict[int, float]]] = {"all": [], "tune": [], "check": []}
    for d, qvec in zip(dialogues, qvecs, strict=True):
        pool = pools[d.user]
        recent = [line.text for line in d.lines[-2:]]
        units = [pool.stands_for[i] for i in rank(pool, d.query, recent, qvec)]
        at_k = {k: recall_at(d.relevant, units, k) for k in KS}
        per["all"].append(at_k)
        per[split_of(d.index)].append(at_k)
    return {s: {k: statistics.fmean(r[k] for r in rows) for k in KS} for s, rows in per.items()}


def line(lang: str, figures: dict[str, dict[int, float]]) -> str:
    return f"{lang} " + "  ".join(
        f"{s} {figures[s][5]:.3f} / {figures[s][10]:.3f}" for s in ("tune", "check", "all")
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/eval/madial")
    parser.add_argument("--lang", choices=["zh", "en"], action="append")
    # vectors are cached by text: give each e5 precision a file of its own
    parser.add_argument("--cache", default=".contextd/madial-vectors.pkl")
    parser.add_argument(
        "--other-language",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="store this share of each user's items in the other language (seeded draw)",
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    embedding = SETTINGS.embedding  # `CONTEXTD_EMBEDDING__E5_PRECISION=int8`: the int8 model
    embedder = create_embedder(
        "e5", precision=embedding.e5_precision, cache_dir=embedding.e5_cache_dir
    )
    assert embedder is not None
    Path(args.cache).parent.mkdir(parents=True, exist_ok=True)
    cache = VectorCache(Path(args.cache), embedder)
    langs: list[Lang] = args.lang or ["zh", "en"]
    for lang in langs:
        memories, dialogues = load_madial(args.data, lang)
        if args.other_language:
            translations, _ = load_madial(args.data, "en" if lang == "zh" else "zh")
            memories = bilingual(memories, translations, args.other_language, args.seed)
        pools = await build_pools(memories, cache)
        qvecs = await query_vectors(dialogues, cache)
        print(line(lang, score(pools, dialogues, qvecs)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
