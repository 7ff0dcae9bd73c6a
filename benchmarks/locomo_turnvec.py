"""Turn-level vectors on LoCoMo, measured in process before any schema change (issue #11).

    .venv/bin/python -m benchmarks.locomo_turnvec RUN_ID [--data F] [--data-dir .contextd]
        [--cache /tmp/turnvec_cache] --variant NAME:arm_k,arm_w,feat_w[,prf_w[,seeds]]
        [--variant ...] [--fit] [--dump F]

Every offloaded turn of the ingestion's sessions is embedded once as an e5 passage (cached as
.npy under `--cache`). A chunk's turn score is its best turn's cosine with the query's e5
vector (the same vector recall searches the chunks with). Four uses, alone or together:

- arm: the `arm_k` chunks with the best turn score are a fourth candidate arm, min-max
  normalised and added to the relative fusion at weight `arm_w` (their rows are read with the
  vector arm's, so chunks no other arm returned become candidates);
- feature: `feat_w` × the turn score min-max normalised over the question's candidates is added
  to `feature_rerank`'s score;
- second hop (`NAME:k,w,f,prf_w[,seeds]`): `prf_w` × each candidate's best turn cosine to the
  turns of the first `seeds` (2) reranked chunks, min-max, added likewise;
- vector arm (`NAME@max:...`, `NAME@avg:...`): the vector arm's cosine of a chunk replaced by
  the larger of its own and its best turn's, or their mean.

Also printed: the evidence the candidates hold; for the first variant, where the chunk vectors
and the turn vectors rank the chunks holding each evidence turn (over all the session's chunks),
and with `--fit` the rerank weights refitted (`benchmarks.locomo_rerank_fit`) with and without
the turn score as a feature.

Recall itself is unchanged: the repository's vector statement, the fusion and the rerank are
wrapped in this process only. Each variant is one pass of `benchmarks.locomo_inprocess`
(tune and check split, per category); `base:0,0,0` is the product as it is. With `--dump F`
each variant's per-question rows are written as JSON lines for a per-category comparison.
"""

import argparse
import asyncio
import json
import os
import statistics
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import text

import app.recall.ranking as recall_ranking
import app.store.chunks as offload_repository
from app.core.config import Settings
from app.core.context import AppContext
from app.core.db import read_once
from app.domain.turn_text import render_turn
from app.eval.locomo import coverage, dia_ids_of_range, load_locomo
from app.recall.fusion import FusedCandidate
from app.recall.hits import RecallHit
from app.recall.rerank import ScoredCandidate
from app.store import turns as turns_store
from benchmarks.locomo_inprocess import (
    TUNE_CONVERSATIONS,
    Asked,
    ask,
    locomo_session,
    score_one,
    table,
)
from benchmarks.locomo_rerank_fit import fit, reordered


@dataclass(frozen=True)
class Variant:
    name: str
    arm_k: int = 0
    arm_w: float = 0.0
    feat_w: float = 0.0
    prf_w: float = 0.0  # second hop in turn space: see `Patched.feature_rerank`
    prf_seeds: int = 2
    vector_mix: str = ""  # "max" / "avg": the vector arm scores a chunk by its own and its turns'


@dataclass
class SessionTurns:
    """One session's turn vectors and, per active chunk, the rows of its turns."""

    vectors: np.ndarray  # (turns, dim), L2-normalised
    chunk_ids: list[str]
    chunk_turns: np.ndarray  # (chunks, widest) turn row indexes, padded with len(seqs)
    seqs: list[int]  # the seq of each turn row
    chunk_vectors: np.ndarray  # (chunks, dim): the stored chunk embeddings

    def seed_similarity(self, ids: Sequence[str], seeds: Sequence[str]) -> list[float]:
        """Per chunk of `ids`, the best cosine between one of its turns and one of the turns of
        the `seeds` chunks other than itself."""
        row = {cid: i for i, cid in enumerate(self.chunk_ids)}
        pad = np.vstack([self.vectors, np.zeros((1, self.vectors.shape[1]), np.float32)])
        seed_turns = {c: pad[self.chunk_turns[row[c]]] for c in seeds if c in row}
        out = []
        for cid in ids:
            if cid not in row:
                out.append(0.0)
                continue
            own = pad[self.chunk_turns[row[cid]]]
            sims = [float((own @ t.T).max()) for c, t in seed_turns.items() if c != cid]
            out.append(max(sims, default=0.0))
        return out

    def chunk_scores(self, qvec: np.ndarray) -> dict[str, float]:
        sims = np.append(self.vectors @ qvec, -np.inf)
        best = sims[self.chunk_turns].max(axis=1)
        return dict(zip(self.chunk_ids, best.tolist(), strict=True))

    def evidence_ranks(self, qvec: np.ndarray) -> dict[int, tuple[int, int]]:
        """Per turn seq, the best rank (1-based, over the session's chunks) of a chunk holding
        it: by the chunk's own vector, and by its best turn's."""
        by_chunk = _ranks(self.chunk_vectors @ qvec)
        sims = np.append(self.vectors @ qvec, -np.inf)
        by_turn = _ranks(sims[self.chunk_turns].max(axis=1))
        out: dict[int, tuple[int, int]] = {}
        for row, turn_rows in enumerate(self.chunk_turns.tolist()):
            for t in turn_rows:
                if t < len(self.seqs):
                    seq = self.seqs[t]
                    a, b = out.get(seq, (10**6, 10**6))
                    out[seq] = (min(a, by_chunk[row]), min(b, by_turn[row]))
        return out


def _ranks(scores: np.ndarray) -> list[int]:
    order = np.argsort(-scores, kind="stable")
    ranks = np.empty(len(scores), dtype=np.int64)
    ranks[order] = np.arange(1, len(scores) + 1)
    return ranks.tolist()


async def turn_vectors(
    run_id: str, data: str, data_dir: Path, cache: Path
) -> dict[uuid.UUID, SessionTurns]:
    dev = json.loads((data_dir / "dev.json").read_text())
    settings = Settings(database_url=dev["database_url"], redis_url=dev["redis_url"])
    context = AppContext.create(settings)
    await context.start_embedder()
    assert context.embedder is not None
    cache.mkdir(parents=True, exist_ok=True)
    out: dict[uuid.UUID, SessionTurns] = {}
    try:
        for conv in load_locomo(data):
            async with context.sessionmaker() as db:
                session = await locomo_session(db, run_id, conv.sample_id)
                found = await db.execute(
                    text("SELECT id FROM chunks WHERE session_id = :s AND status = 'active'"),
                    {"s": session.id},
                )
                chunk_ids = sorted(str(row[0]) for row in found.all())
                stored = await db.execute(
                    text("SELECT id, embedding::text FROM chunks WHERE session_id = :s"),
                    {"s": session.id},
                )
                chunk_vector = {str(cid): json.loads(v) for cid, v in stored.all()}
            key = session.key
            by_chunk = await read_once(
                context.reader,
                lambda conn, key=key, ids=chunk_ids: turns_store.turns_of_chunks(
                    conn, key.tenant_id, key.id, ids
                ),
            )
            seqs = sorted({t.seq for turns in by_chunk.values() for t in turns})
            row_of = {seq: i for i, seq in enumerate(seqs)}
            file = cache / f"{session.external_id}.npy"
            if file.exists():
                vectors = np.load(file)
            else:
                texts = {t.seq: render_turn(t) for turns in by_chunk.values() for t in turns}
                parts = [
                    await context.embedder.embed_passages([texts[s] for s in seqs[i : i + 64]])
                    for i in range(0, len(seqs), 64)
                ]
                vectors = np.vstack(parts).astype(np.float32)
                np.save(file, vectors)
            widest = max(len(turns) for turns in by_chunk.values())
            kept = [c for c in chunk_ids if c in by_chunk]
            index = np.full((len(kept), widest), -1, dtype=np.int64)
            for i, cid in enumerate(kept):
                rows = [row_of[t.seq] for t in by_chunk[cid]]
                index[i, : len(rows)] = rows
            index[index < 0] = len(seqs)  # the appended -inf
            out[session.id] = SessionTurns(
                vectors, kept, index, seqs, np.array([chunk_vector[c] for c in kept], np.float32)
            )
            print(f"{session.external_id}: {len(seqs)} turns, {len(kept)} chunks", flush=True)
    finally:
        await context.aclose()
    return out


class Patched:
    """The wrappers around recall's vector statement, fusion and rerank for one variant."""

    def __init__(self, turns: dict[uuid.UUID, SessionTurns]) -> None:
        self.turns = turns
        self.variant = Variant("base")
        self.scores: dict[str, float] = {}  # the current question's chunk turn scores
        self.arm: dict[str, float] = {}
        # (query, session's last seq) -> the turn ranges of every candidate the rerank saw, and
        # the turn score of each candidate chunk (for the fit)
        self.candidates: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self.turn_scores: dict[tuple[str, int], dict[str, float]] = {}
        self.ranks: dict[int, tuple[int, int]] = {}
        self.session: uuid.UUID | None = None
        self.evidence_ranks: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
        self._nearest = offload_repository.nearest_and_shown
        self._fuse = recall_ranking.fuse_arms
        self._rerank = recall_ranking.feature_rerank
        offload_repository.nearest_and_shown = self.nearest_and_shown  # type: ignore[assignment]
        recall_ranking.fuse_arms = self.fuse_arms  # type: ignore[assignment]
        recall_ranking.feature_rerank = self.feature_rerank  # type: ignore[assignment]

    async def nearest_and_shown(
        self,
        conn: Any,
        session_pk: uuid.UUID,
        model: str,
        vector: Sequence[float] | None,
        limit: int,
        ids: Sequence[str],
        known: Collection[str] = frozenset(),
    ) -> offload_repository.RecallRows:
        if vector is not None:
            q = np.asarray(vector, dtype=np.float32)
            q = q / np.linalg.norm(q)
            self.session = session_pk
            self.scores = self.turns[session_pk].chunk_scores(q)
            self.ranks = self.turns[session_pk].evidence_ranks(q)
            k = self.variant.arm_k
            self.arm = dict(sorted(self.scores.items(), key=lambda p: -p[1])[:k]) if k else {}
            ids = [*ids, *self.arm]
            mix = self.variant.vector_mix
            if mix:
                turns = self.turns[session_pk]
                own = dict(zip(turns.chunk_ids, (turns.chunk_vectors @ q).tolist(), strict=True))
                mixed = {
                    c: max(v, self.scores[c]) if mix == "max" else (v + self.scores[c]) / 2
                    for c, v in own.items()
                }
                nearest = dict(sorted(mixed.items(), key=lambda p: -p[1])[:limit])
                rows = await self._nearest(conn, session_pk, model, None, limit, [*ids, *nearest])
                return offload_repository.RecallRows(nearest, rows.shown)
        return await self._nearest(conn, session_pk, model, vector, limit, ids, known)

    def fuse_arms(self, **kwargs: Any) -> list[FusedCandidate]:
        fused = self._fuse(**kwargs)
        if not self.arm:
            return fused
        low, high = min(self.arm.values()), max(self.arm.values())
        totals = {f.id: f.score for f in fused}
        for cid, s in self.arm.items():
            norm = (s - low) / (high - low) if high > low else 1.0
            totals[cid] = totals.get(cid, 0.0) + self.variant.arm_w * norm
        before = {f.id: f for f in fused}
        order = sorted(totals, key=lambda d: -totals[d])
        return [
            replace(before[d], score=totals[d], rank=rank)
            if d in before
            else FusedCandidate(id=d, score=totals[d], rank=rank)
            for rank, d in enumerate(order, start=1)
        ]

    def feature_rerank(self, query: Any, candidates: Any, now_seq: int) -> list[ScoredCandidate]:
        scored = self._rerank(query, candidates, now_seq)
        key = (query.raw, now_seq)
        self.candidates[key] = [c.turn_range for c in candidates]
        self.turn_scores[key] = {c.id: self.scores.get(c.id, 0.0) for c in candidates}
        self.evidence_ranks[key] = self.ranks
        if self.variant.prf_w and scored:
            scored = self._second_hop(scored)
        w = self.variant.feat_w
        if w == 0 or not scored:
            return scored
        raw = [self.scores.get(s.id, 0.0) for s in scored]
        return _bumped(scored, raw, w)

    def _second_hop(self, scored: list[ScoredCandidate]) -> list[ScoredCandidate]:
        """`prf_w` × each candidate's best turn similarity to the turns of the first
        `prf_seeds` reranked chunks (pseudo-relevance feedback in turn space: a list question's
        other answers resemble the first answer more than the question)."""
        seeds = [s.id for s in scored[: self.variant.prf_seeds]]
        assert self.session is not None  # set by the vector statement before the rerank
        raw = self.turns[self.session].seed_similarity([s.id for s in scored], seeds)
        return _bumped(scored, raw, self.variant.prf_w)


def _bumped(
    scored: Sequence[ScoredCandidate], raw: Sequence[float], w: float
) -> list[ScoredCandidate]:
    """`scored` with w × `raw` (min-max over the candidates) added to each score, best first."""
    low, high = min(raw), max(raw)
    span = high - low if high > low else 1.0
    bumped = [
        replace(s, score=s.score + w * (r - low) / span) for s, r in zip(scored, raw, strict=True)
    ]
    order = sorted(
        range(len(bumped)), key=lambda i: (-bumped[i].score, bumped[i].candidate.fused_rank, i)
    )
    return [bumped[i] for i in order]


def question_key(a: Asked) -> tuple[str, int]:
    """The key `Patched` files a question's recall under (the session's last seq is the last
    window turn's)."""
    return (a.question, a.window[-1].seq)


def candidate_recall(asked: Sequence[Asked], patched: Patched) -> str:
    """Evidence turns held by any candidate the rerank saw (the ceiling of the ranking)."""
    out = []
    for split, keep in (
        ("tune", lambda c: c < TUNE_CONVERSATIONS),
        ("check", lambda c: c >= TUNE_CONVERSATIONS),
    ):
        for category in (1, 0):
            sel = [a for a in asked if keep(a.conversation) and category in (0, a.category)]
            held = []
            for a in sel:
                ranges = patched.candidates.get(question_key(a), [])
                got = set().union(
                    *[dia_ids_of_range(f, t, a.seq_to_dia) for f, t in ranges], a.in_window
                )
                held.append(coverage(a.evidence, got))
            name = "multi-hop" if category == 1 else "overall"
            out.append(f"{split} {name} candidates hold {statistics.fmean(held):.3f}")
    return "; ".join(out)


def refit(asked: Sequence[Asked], patched: Patched) -> str:
    """The pairwise logistic fit of `benchmarks.locomo_rerank_fit` on the tune split, without
    and with the turn score (min-max over the question's hits) as a feature; both orders packed
    by the assembler at every budget."""

    def turn_column(a: Asked, hits: Sequence[RecallHit]) -> np.ndarray:
        scores = patched.turn_scores.get(question_key(a), {})
        raw = np.array([scores.get(h.id, 0.0) for h in hits], dtype=float)
        span = raw.max() - raw.min() if len(raw) and raw.max() > raw.min() else 1.0
        return ((raw - (raw.min() if len(raw) else 0.0)) / span).reshape(len(hits), 1)

    tune = [a for a in asked if a.conversation < TUNE_CONVERSATIONS]
    plain = fit(tune, 0.001)
    with_turn = fit(tune, 0.001, turn_column, ("turn",))
    out = []
    for name, weights, extra in (
        ("refit", plain, None),
        ("refit+turn", with_turn, turn_column),
    ):
        rows = [
            score_one(a, reordered(a.shown, weights, extra(a, a.shown) if extra else None))
            for a in asked
        ]
        rounded = {k: round(v, 3) for k, v in weights.items()}
        out.append(f"## {name} {rounded}\n{table(rows)}")
    return "\n".join(out)


def rank_table(asked: Sequence[Asked], patched: Patched) -> str:
    """Where the chunk vectors and the turn vectors rank the chunks holding each evidence turn
    (over all the session's chunks), for every evidence turn and for those no candidate held."""
    lines = []
    for split, keep in (
        ("tune", lambda c: c < TUNE_CONVERSATIONS),
        ("check", lambda c: c >= TUNE_CONVERSATIONS),
    ):
        for category in (1, 2, 3, 4, 0):
            for only_missed in (False, True):
                pairs = []
                for a in asked:
                    if not keep(a.conversation) or category not in (0, a.category):
                        continue
                    key = question_key(a)
                    dia_to_seq = {d: s for s, d in a.seq_to_dia.items()}
                    ranges = patched.candidates.get(key, [])
                    held = set().union(*[dia_ids_of_range(f, t, a.seq_to_dia) for f, t in ranges])
                    for dia in a.evidence:
                        seq = dia_to_seq.get(dia)
                        if seq is None or dia in a.in_window or (only_missed and dia in held):
                            continue
                        pairs.append(patched.evidence_ranks[key].get(seq, (10**6, 10**6)))
                if not pairs:
                    continue
                cells = []
                for k in (10, 30, 100):
                    chunk = sum(c <= k for c, _ in pairs) / len(pairs)
                    turn = sum(t <= k for _, t in pairs) / len(pairs)
                    either = sum(min(c, t) <= k for c, t in pairs) / len(pairs)
                    cells.append(f"<={k}: chunk {chunk:.2f} turn {turn:.2f} either {either:.2f}")
                name = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}.get(
                    category, "overall"
                )
                what = "not in candidates" if only_missed else "all evidence"
                lines.append(f"{split} {name} {what} n={len(pairs)}: " + "; ".join(cells))
    return "\n".join(lines)


def parse_variant(spec: str) -> Variant:
    name, _, values = spec.partition(":")
    k, arm_w, feat_w, *prf = values.split(",")
    mix = name.partition("@")[2].partition("+")[0]
    hop: dict[str, Any] = {"prf_w": float(prf[0])} if prf else {}
    if mix:
        hop["vector_mix"] = mix
    if len(prf) > 1:
        hop["prf_seeds"] = int(prf[1])
    return Variant(name, int(k), float(arm_w), float(feat_w), **hop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_id")
    parser.add_argument("--data", default="../shared/eval/locomo/locomo_dev.json")
    parser.add_argument("--data-dir", default=".contextd", type=Path)
    parser.add_argument("--cache", default="/tmp/turnvec_cache", type=Path)
    parser.add_argument("--variant", action="append", type=parse_variant, required=True)
    parser.add_argument("--dump", type=Path)
    parser.add_argument(
        "--fit",
        action="store_true",
        help="after the first variant: refit the rerank weights with and without the turn score",
    )
    args = parser.parse_args()
    # The wrapper sits on the vector statement: recall must scan in PostgreSQL, not in process.
    os.environ["CONTEXTD_RECALL__VECTOR_SCAN_IN_PROCESS_MB"] = "0"
    turns = asyncio.run(turn_vectors(args.run_id, args.data, args.data_dir, args.cache))
    patched = Patched(turns)
    for variant in args.variant:
        patched.variant = variant
        asked = asyncio.run(ask(args.run_id, args.data, args.data_dir, None))
        rows = [score_one(a, a.shown) for a in asked]
        print(f"## {variant}\n{table(rows)}", flush=True)
        print(candidate_recall(asked, patched), flush=True)
        if variant is args.variant[0]:
            print(rank_table(asked, patched), flush=True)
        if args.fit and variant is args.variant[0]:
            print(refit(asked, patched), flush=True)
        if args.dump:
            with args.dump.open("a") as out:
                for a, row in zip(asked, rows, strict=True):
                    out.write(json.dumps({"variant": variant.name, "q": a.question, **row}) + "\n")


if __name__ == "__main__":
    main()
