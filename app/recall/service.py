"""The recall chain: rewrite → exact hits → embed → wide recall (BM25 + vector) → fusion
(`app.recall.fusion`) → rerank → drop what is already in the window and duplicates. Callers then
cut to k and a token budget.

Every arm degrades on its own: an embedder or vector failure leaves lexical recall
(`vector_unavailable`), a rerank failure the fused order (`rerank_unavailable`), an optional LLM
rewrite failure the rule-based rewrite (`rewrite_unavailable`).
"""

import asyncio
import hashlib
import json
import logging
import re
import statistics
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import numpy as np
import psycopg
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.context import AppContext
from app.core.cpu import off_loop
from app.core.dates import query_date_terms
from app.core.db import read_once, release
from app.core.text import match_terms, mostly_cjk, terms
from app.domain.records import RecalledItem
from app.embeddings.base import (
    EmbedderBusy,
    EmbedderTimeout,
    EmbedderUnavailable,
    l2_normalise,
)
from app.offload import repository
from app.offload.chunking import render_turn
from app.recall.adapter import chunk_query_vector
from app.recall.bm25 import BM25Index, idf
from app.recall.cross_encoder import HttpReranker, RerankUnavailable
from app.recall.fusion import ArmWeights, FusedCandidate, fuse_arms
from app.recall.languages import ADAPTED_OFFSETS, RAW_OFFSETS, calibrated, in_other_language
from app.recall.llm_rewrite import QueryRewriteUnavailable, llm_rewrite
from app.recall.rerank import (
    RerankCandidate,
    RerankFeatures,
    ScoredCandidate,
    feature_rerank,
    select_within_budget,
    text_key,
)
from app.recall.rewrite import RewrittenQuery, content_term_count, rewrite_query
from app.recall.stem import by_stem
from app.recall.trim import trim_chunk
from app.recall.vectors import ChunkVectors
from app.store import memories as memories_store
from app.store import turns as turns_store
from app.store.models import Memory, Session

logger = logging.getLogger("contextd.recall")

MEMORY_PREFIX = "memory:"
# Terms the rewrite borrowed from recent turns help resolve "that one", but must not outweigh what
# the user actually asked (recent small talk would otherwise drown the question).
BORROWED_TERM_WEIGHT = 0.25


def weighted_terms(
    query: str, rewritten: RewrittenQuery, llm_query: str | None = None
) -> dict[str, float]:
    """BM25 query weights: the user's own terms at 1 each, borrowed context terms (the rule
    rewrite's, then those the LLM rewrite added) at a quarter."""
    weights: dict[str, float] = {}
    for term in terms(query):
        weights[term] = weights.get(term, 0.0) + 1.0
    for term in terms(" ".join(rewritten.appended)):
        if term not in weights or weights[term] < 1.0:
            weights[term] = weights.get(term, 0.0) + BORROWED_TERM_WEIGHT
    for term in terms(llm_query or ""):
        weights.setdefault(term, BORROWED_TERM_WEIGHT)
    return weights


MIN_OWN_TERMS_TO_EMBED = 2


def own_words_suffice(query: str) -> bool:
    """Whether the user's words mean enough on their own to be embedded as they are."""
    return content_term_count(query) >= MIN_OWN_TERMS_TO_EMBED


def embedding_query(query: str, rewritten: RewrittenQuery) -> str:
    """What to embed: the user's words, unless they are too few to mean anything on their own
    ("and that one?"), then the rewrite with its borrowed context."""
    return query if own_words_suffice(query) else rewritten.rewritten


@dataclass(frozen=True)
class RecallHit:
    id: str  # chunk uuid, or "memory:<uuid>"
    source: Literal["chunk", "memory"]
    turn_first: int | None
    turn_last: int | None
    ts: datetime
    text: str
    trusted: bool
    score: float
    fused: FusedCandidate
    features: RerankFeatures | None
    # How far the hit's cosine similarity stands above the median of its vector arm's candidates
    # (None: the vector arm did not return it). The memory tool's match gate reads it.
    vector_margin: float | None = None
    # The hit cut down to the turns that answer the query (None: not cut).
    compact_text: str | None = None
    compact_seqs: tuple[int, ...] | None = None
    part: int = 1
    parts: int = 1
    text_tokens: int | None = None  # count_tokens(text), a chunk's stored count


def recalled_item(hit: RecallHit, *, memory_source: str = "memory") -> RecalledItem:
    """A hit as the prompt and the memory tool render it (`[ts | turn a-b | id]` + text), with
    its compact version when it has one (both built directly: `dataclasses.replace` took
    ~14 µs an item, ~20 items a build)."""
    chunk_id = hit.id.removeprefix(MEMORY_PREFIX)
    source = memory_source if hit.source == "memory" else "chunk"

    def item(
        text: str,
        seqs: tuple[int, ...] | None = None,
        compact: RecalledItem | None = None,
        text_tokens: int | None = None,
    ) -> RecalledItem:
        return RecalledItem(
            chunk_id=chunk_id,
            text=text,
            ts=hit.ts,
            turn_first=hit.turn_first,
            turn_last=hit.turn_last,
            trusted=hit.trusted,
            score=hit.score,
            source=source,
            seqs=seqs,
            compact=compact,
            text_tokens=text_tokens,
        )

    compact = None if hit.compact_text is None else item(hit.compact_text, hit.compact_seqs)
    return item(hit.text, compact=compact, text_tokens=hit.text_tokens)


@dataclass
class RecallOutcome:
    query: RewrittenQuery
    hits: list[RecallHit]  # ranked, in-window and duplicate candidates removed
    query_terms: dict[str, float] = field(default_factory=dict)  # BM25 weights of the query
    dropped: list[tuple[RecallHit, str]] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    candidates: int = 0


def _chunk_fields(chunk: repository.ShownChunk) -> dict[str, Any]:
    return {
        "turn_first": chunk.turn_first,
        "turn_last": chunk.turn_last,
        "part": chunk.part,
        "parts": chunk.parts,
        "ts": chunk.ts_last,
        "text": chunk.raw_text,
        "trusted": chunk.trusted,
        "text_tokens": chunk.token_count,
    }


class _Clock:
    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round(self.timings.get(stage, 0.0) + (now - self._last) * 1000, 3)
        self._last = now


def _rule_rewrite(
    query: str, recent_turns: Sequence[str], now: datetime
) -> tuple[RewrittenQuery, dict[str, float], list[str]]:
    """The rule rewrite, its weighted terms and the query's date terms (CPU only: run off the
    event loop for long text)."""
    rewritten = rewrite_query(query, recent_turns)
    return rewritten, weighted_terms(query, rewritten), query_date_terms(query, now)


def _stemmed(
    stats: Sequence[tuple[str, Mapping[str, int]]],
) -> list[tuple[str, dict[str, int]]]:
    return [(cid, by_stem(counts)) for cid, counts in stats]


# A vector scan over more than this many bytes of vectors runs in a worker thread (numpy releases
# the GIL): ~2,700 chunks of 384 dimensions, about 0.2 ms of scan.
INLINE_SCAN_BYTES = 4 * 2**20

# The chunks of a session this process keeps what recall read of (`_SessionChunks`): a shown
# chunk's rendered turns, a vector candidate's row. Each is read once per process, not on every
# build that meets the chunk again.
CHUNKS_KEPT = 1024

ChunkLines = tuple[tuple[int, str], ...]  # a chunk's live turns as (seq, rendered line), in order


@dataclass
class _SessionChunks:
    """What this process keeps of a session's active chunks at one `chunks_version`: their BM25
    index; for the chunks recall has shown, their turns as rendered lines; for the chunks it has
    read, their rows as recall shows them (`ShownChunk`) and their texts' duplicate keys
    (`rerank.text_key`). At most `CHUNKS_KEPT` of each, least recently used dropped first.

    An active chunk's row and live turns never change: forgetting any of its turns tombstones
    the chunk and re-chunks the rest under new ids (`app.erasure.service`), an offload writes a
    chunk and marks its turns in one transaction, and only its vector is written later. So kept
    lines and rows are those a read would return for every chunk the build found active (the
    vector arm returns active chunks only: its statement reads active ones, the scan in process
    holds the chunks of this state's index), in any process; and a
    forgotten chunk's lines and row are dropped at the session's next build in this process (a
    new `chunks_version`, whose index no longer holds the chunk)."""

    index: BM25Index
    lines: dict[str, ChunkLines] = field(default_factory=dict)
    rows: dict[str, repository.ShownChunk] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    vectors: ChunkVectors | None = None  # when the session's vector arm scans in process

    def carried_to(self, index: BM25Index) -> "_SessionChunks":
        """This state's lines, rows, keys and vectors for the chunks `index` (of a later
        version) still holds."""
        active = set(index.ids)
        return _SessionChunks(
            index,
            {c: t for c, t in self.lines.items() if c in active},
            {c: r for c, r in self.rows.items() if c in active},
            {c: k for c, k in self.keys.items() if c in active},
            None if self.vectors is None else self.vectors.kept_for(active),
        )

    def unvectored(self, model: str) -> list[str]:
        """The active chunks whose vector of `model` this process does not hold."""
        held = self.vectors
        if held is None or held.model != model:
            return list(self.index.ids)
        if len(held.ids) == len(self.index.ids):  # held ones are active ones
            return []
        return [cid for cid in self.index.ids if cid not in held.held]

    def add_vectors(self, model: str, vectors: Mapping[str, np.ndarray]) -> ChunkVectors:
        held = self.vectors
        if held is None or held.model != model:
            held = ChunkVectors(model)
        self.vectors = held.with_vectors(vectors)
        return self.vectors

    def keep(self, chunk_id: str, lines: ChunkLines) -> None:
        _kept(self.lines, chunk_id, lines)

    def shown(self, chunk_id: str) -> ChunkLines | None:
        return _used(self.lines, chunk_id)

    def keep_rows(self, rows: Iterable[repository.ShownChunk]) -> None:
        """Keep the active ones of `rows` (read by this build)."""
        for row in rows:
            if row.status == "active":
                _kept(self.rows, row.id, row)

    def row(self, chunk_id: str) -> repository.ShownChunk | None:
        return _used(self.rows, chunk_id)

    def text_key(self, chunk_id: str, text: str) -> str:
        """`rerank.text_key` of an active chunk's `text`."""
        key = _used(self.keys, chunk_id)
        if key is None:
            key = text_key(text)
            _kept(self.keys, chunk_id, key)
        return key


Kept = TypeVar("Kept")


def _kept(kept: dict[str, Kept], chunk_id: str, value: Kept) -> None:
    kept.pop(chunk_id, None)
    kept[chunk_id] = value  # most recently used last
    while len(kept) > CHUNKS_KEPT:
        del kept[next(iter(kept))]


def _used(kept: dict[str, Kept], chunk_id: str) -> Kept | None:
    value = kept.pop(chunk_id, None)
    if value is not None:
        kept[chunk_id] = value  # most recently used last
    return value


async def _session_chunks(
    db: AsyncSession, context: AppContext, session: Session
) -> _SessionChunks:
    """The session's BM25 index over its active chunks, their terms merged under their stems
    (`app.recall.stem`), and its shown chunks' lines, kept per process per chunk state. After the
    chunks changed, the process's index of an earlier state is extended by the chunks added
    since, when none of its chunks went away (an offload only adds); otherwise it is built anew.
    Built off the event loop and outside the transaction: a session's history can be large."""
    key = (str(session.id), session.chunks_version)
    cached = context.lexical_indexes.get(key)
    if isinstance(cached, _SessionChunks):
        return cached
    latest = context.lexical_indexes.latest(key[0])
    earlier = latest[1] if latest is not None and latest[0] < key[1] else None
    state: _SessionChunks | None = None
    if isinstance(earlier, _SessionChunks):
        active = {str(cid) for cid in await repository.active_chunk_ids(db, session.id)}
        known = set(earlier.index.ids)
        if known <= active:
            added = await repository.term_stats(db, session.id, sorted(active - known))
            await release(db)
            index = await asyncio.to_thread(earlier.index.extended, _stemmed(added))
            state = _SessionChunks(
                index, earlier.lines, earlier.rows, earlier.keys, earlier.vectors
            )
    if state is None:
        stats = await repository.term_stats(db, session.id)
        await release(db)
        index = await asyncio.to_thread(lambda: BM25Index.from_term_counts(_stemmed(stats)))
        state = (
            earlier.carried_to(index)
            if isinstance(earlier, _SessionChunks)
            else _SessionChunks(index)
        )
    context.lexical_indexes.put(key, state)
    return state


def _vector_index(context: AppContext, session: Session) -> repository.VectorIndexScan | None:
    """A large session is searched through its own HNSW index (once the worker built it)."""
    settings = context.settings.recall
    if context.embedder is None or session.chunk_count < settings.vector_index_min_chunks:
        return None
    return repository.VectorIndexScan(context.embedder.dim, settings.vector_index_ef_search)


def _scans_in_process(context: AppContext, session: Session) -> bool:
    """Whether the session's vector arm is an exact scan in process (`app.recall.vectors`): a
    session searched by an exact scan whose vectors fit `recall.vector_scan_in_process_mb`,
    when this process keeps sessions' state at all."""
    settings = context.settings.recall
    embedder = context.embedder
    return (
        embedder is not None
        and settings.lexical_index_cache_sessions > 0
        and _vector_index(context, session) is None
        and session.chunk_count * embedder.dim * 4 <= settings.vector_scan_in_process_mb * 2**20
    )


def _missing_vectors(
    context: AppContext, session: Session, chunks: _SessionChunks, model: str
) -> "asyncio.Future[dict[str, np.ndarray]]":
    """The read of the vectors of the session's active chunks this process does not hold yet
    (every chunk at the session's first build here; then those embedded since), started now
    so that it runs while the query embeds; done already when every one is held."""
    unvectored = chunks.unvectored(model)
    if not unvectored:
        held: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
        held.set_result({})
        return held
    return asyncio.ensure_future(
        read_once(
            context.reader,
            lambda conn: repository.chunk_vectors(conn, session.id, model, unvectored),
        )
    )


async def _scan_in_process(
    chunks: _SessionChunks,
    model: str,
    missing: "asyncio.Future[dict[str, np.ndarray]]",
    qvec: Sequence[float],
    limit: int,
) -> dict[str, float]:
    """The vector arm over the vectors this process holds, with those `missing` added."""
    vectors = chunks.add_vectors(model, await missing)
    if vectors.nbytes <= INLINE_SCAN_BYTES:
        return vectors.nearest(qvec, limit)
    return await asyncio.to_thread(vectors.nearest, qvec, limit)


async def _exact(
    context: AppContext, session: Session, needles: Sequence[str], limit: int
) -> list[str]:
    """The exact arm (`repository.exact_hits`, on the reader pool): only a query holding an ID or
    a quoted string reads anything."""
    if not needles:
        return []
    return await read_once(
        context.reader, lambda conn: repository.exact_hits(conn, session.id, needles, limit)
    )


def _discard(read: "asyncio.Future[Any] | None") -> None:
    """Cancel a read no longer wanted; one that failed already has its error taken (not logged
    as never retrieved: the build reported or did without it)."""
    if read is not None and not read.cancel() and not read.cancelled():
        read.exception()


async def _nearest_and_shown(
    context: AppContext,
    session: Session,
    chunks: _SessionChunks,
    qvec: Sequence[float] | None,
    limit: int,
    others: "asyncio.Future[repository.RecallRows]",
    vectors_read: "asyncio.Future[dict[str, np.ndarray]] | None",
    fallbacks: list[str],
    query: str,
) -> repository.RecallRows:
    """The vector arm (with a query vector) and the shown rows of its chunks, with `others` (the
    shown rows of the other arms' candidates, being read meanwhile). The arm is a scan in
    process when the session's is (`_scans_in_process`: then `vectors_read` is the read of the
    vectors not held yet, None otherwise); otherwise on the reader pool, one statement when the
    session is searched by an exact scan. Its chunks' rows come from those this process keeps
    (`chunks.rows`) when it keeps any: the scan then returns ids and distances, and only the
    rows of chunks not kept are read. A session with its own HNSW index is searched through it
    (`repository.nearest_through_index`). A failing vector arm leaves lexical recall
    (`vector_unavailable`). For a Chinese `query` the candidates in another language are
    scored as in its (`app.recall.languages`)."""
    embedder = context.embedder
    found: dict[str, float] = {}
    near: dict[str, repository.ShownChunk] = {}
    offsets = RAW_OFFSETS
    try:
        if qvec is not None and embedder is not None:
            raw = qvec
            qvec = chunk_query_vector(qvec, embedder.name, context.settings.recall.query_adapter)
            if qvec is not raw:  # the adapter returns its input where it does not apply
                offsets = ADAPTED_OFFSETS
            index = _vector_index(context, session)
            try:
                if vectors_read is not None:
                    found = await _scan_in_process(chunks, embedder.name, vectors_read, qvec, limit)
                elif index is None:
                    rows = await read_once(
                        context.reader,
                        lambda conn: repository.nearest_and_shown(
                            conn, session.id, embedder.name, qvec, limit, [], chunks.rows.keys()
                        ),
                    )
                    found, near = rows.nearest, rows.shown
                else:
                    rows = await read_once(
                        context.reader,
                        lambda conn: repository.nearest_through_index(
                            conn, session.id, embedder.name, qvec, limit, index
                        ),
                    )
                    found, near = rows.nearest, rows.shown
            except (SQLAlchemyError, psycopg.Error) as exc:
                logger.warning("vector recall unavailable, lexical only: %s", exc)
                fallbacks.append("vector_unavailable")
        known = (await others).shown
    finally:
        for read in (others, vectors_read):  # read already, unless the vector arm raised
            _discard(read)
    for cid in found:
        kept = None if cid in near else chunks.row(cid)
        if kept is not None:
            near[cid] = kept  # active: the vector arm returns active chunks only
    missing = [cid for cid in found if cid not in near and cid not in known]
    if missing:
        rows = await read_once(
            context.reader,
            lambda conn: repository.nearest_and_shown(conn, session.id, "", None, limit, missing),
        )
        near = {**near, **rows.shown}
    chunks.keep_rows(near.values())
    chunks.keep_rows(known.values())
    shown = {**known, **near}
    # A Chinese question is scored against the English chunks among the arm's candidates as
    # against Chinese ones (`app.recall.languages`). For an English question the gap (.018) is
    # within its spread: English builds skip the language check.
    if found and mostly_cjk(query):
        texts = {cid: shown[cid].raw_text for cid in found if cid in shown}
        if in_other_language(True, texts):
            found = calibrated({cid: found[cid] for cid in texts}, True, texts, len(texts), offsets)
    return repository.RecallRows(found, shown)


# A single CJK character is half a word: beside a query's bigrams and words it weighs this much
# (MADial zh R@5 tune .675 -> .695, check .613 -> .617; .3-.8 measured, docs/BENCHMARKS.md).
CJK_CHARACTER_WEIGHT = 0.6


def lexical_arm(index: BM25Index, query_terms: dict[str, float], limit: int) -> dict[str, float]:
    """BM25 scores of the best `limit` documents, best first (query terms stemmed like the
    index's; LoCoMo tune split B500 .671 -> .681, check .693 -> .701). A document sharing only
    single CJK characters with a query that has words or bigrams is no hit (`match_terms`): in a
    mostly English session "我们住在哪个酒店？" matched "我会记住…" by its 住 and outranked the
    hotel the vector arm found. Beside them a single character weighs `CJK_CHARACTER_WEIGHT`."""
    stemmed = by_stem(query_terms)
    anchors = match_terms(stemmed)
    if len(anchors) == len(stemmed):  # every English query, or single characters only
        return dict(index.score(stemmed, top_n=limit))
    weighted = {t: w if t in anchors else w * CJK_CHARACTER_WEIGHT for t, w in stemmed.items()}
    return dict(index.score(weighted, top_n=limit, any_of=anchors))


async def show_best_turns(
    db: AsyncSession,
    context: AppContext,
    session: Session,
    outcome: "RecallOutcome",
    limit: int,
) -> list[RecallHit]:
    """The first `limit` hits, each chunk with a compact version cut down to the turns that
    answer the query (`app.recall.trim`), which the assembler uses when the whole chunk does not
    fit; pieces of a split turn and remembered items have none."""
    hits = outcome.hits[:limit]
    chunks = await _session_chunks(db, context, session)
    lines: dict[str, ChunkLines] = {}
    for hit in hits:
        if hit.source == "chunk" and hit.parts == 1:
            known = chunks.shown(hit.id)
            if known is not None:
                lines[hit.id] = known
    wanted = [h.id for h in hits if h.source == "chunk" and h.parts == 1 and h.id not in lines]
    if wanted:
        read = await read_once(
            context.reader,
            lambda conn: turns_store.turns_of_chunks(conn, session.id, wanted),
        )
        for chunk_id, turns in read.items():
            lines[chunk_id] = tuple((t.seq, render_turn(t)) for t in turns)
            chunks.keep(chunk_id, lines[chunk_id])
    index = chunks.index
    n_docs = len(index)

    def term_idf(term: str) -> float:
        return idf(n_docs, index.df(term))

    query_weights = by_stem(outcome.query_terms)
    out: list[RecallHit] = []
    for hit in hits:
        own = lines.get(hit.id)
        if not own:
            out.append(hit)
            continue
        trimmed = trim_chunk(own, query_weights, term_idf)
        if trimmed.trimmed:
            hit = replace(hit, compact_text=trimmed.text, compact_seqs=trimmed.seqs)
        out.append(hit)
    return out


# The first this many fused candidates that call tools bring the chunks of their results.
CALLS_FOLLOWED = 5
_TOOL_CALLS_MARK = " → tool_calls: "  # the line `turn_body` ends a calling turn with


@dataclass(frozen=True)
class CallChunk:
    """A fused candidate whose last turn calls tools, and its text."""

    fused: FusedCandidate
    text: str


@dataclass(frozen=True)
class ResultOfCall:
    """A chunk holding a tool result, and the candidate holding the call it answers."""

    chunk: repository.ShownChunk
    call: CallChunk


def calls_at_end(text: str) -> int:
    """How many tool calls the last turn of a chunk's `text` makes (0: its last turn calls no
    tool). A call line cut by a split turn counts as one call."""
    if _TOOL_CALLS_MARK not in text:  # a conversation's chunks: no copy of the text
        return 0
    lines = text.rstrip().rsplit("\n", 1)
    last = lines[-1]
    at = last.find(_TOOL_CALLS_MARK)
    if at < 0:
        return 0
    try:
        calls = json.loads(last[at + len(_TOOL_CALLS_MARK) :])
    except ValueError:
        return 1
    return len(calls) if isinstance(calls, list) and calls else 1


async def _results_of_calls(
    db: AsyncSession,
    session: Session,
    fused: Sequence[FusedCandidate],
    fields: Mapping[str, Mapping[str, Any]],
) -> dict[str, ResultOfCall]:
    """The chunks holding the results of the tool calls that end one of the first
    `CALLS_FOLLOWED` fused chunks, by chunk id. A tool result is data the call asked for, and
    a long one is chunked apart from its call (`app.offload.chunking`): the piece holding
    `SECRET_CONST_3 = ...` does not name `billing/mod3.py`, the call that read it does. Found by
    its call, a result ranks with it (`with_results_of_calls`) and is matched against the
    query's keys with the call's text (`RerankCandidate.call_text`)."""
    calls: list[tuple[CallChunk, int, int]] = []
    for f in fused:
        if len(calls) >= CALLS_FOLLOWED:
            break
        if f.id.startswith(MEMORY_PREFIX) or f.id not in fields:
            continue
        text = fields[f.id]["text"]
        count = calls_at_end(text)
        if count:
            last = fields[f.id]["turn_last"]
            calls.append((CallChunk(f, text), last + 1, last + count))
    found: dict[str, ResultOfCall] = {}
    for call, first, last in calls:
        for chunk in await repository.chunks_overlapping(db, session.id, first, last):
            if chunk.raw_text.startswith("tool") and str(chunk.id) not in found:
                shown = repository.ShownChunk(
                    str(chunk.id),
                    chunk.status,
                    chunk.turn_first,
                    chunk.turn_last,
                    chunk.part,
                    chunk.parts,
                    chunk.ts_last,
                    chunk.raw_text,
                    chunk.trusted,
                    chunk.token_count,
                )
                found[shown.id] = ResultOfCall(shown, call)
    return found


def with_results_of_calls(
    fused: Sequence[FusedCandidate], answered: Mapping[str, ResultOfCall]
) -> list[FusedCandidate]:
    """`fused` with each result of a call (`answered`) scored as its call when that is better
    than its own score, the results no arm returned placed right after their call."""
    out: list[FusedCandidate] = []
    known = {f.id for f in fused}
    for f in fused:
        result = answered.get(f.id)
        if result is not None and result.call.fused.score > f.score:
            f = replace(f, score=result.call.fused.score, rank=result.call.fused.rank)
        out.append(f)
        out.extend(
            FusedCandidate(id=cid, score=f.score, rank=f.rank)
            for cid, r in answered.items()
            if r.call.fused.id == f.id and cid not in known
        )
    return out


def _normalised(scores: dict[str, float]) -> dict[str, float]:
    """Min-max to [0, 1] (all equal: 1.0), the relative fusion's scale, order kept."""
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    span = high - low
    return {d: (v - low) / span if span > 0 else 1.0 for d, v in scores.items()}


def _memory_lexical(
    context: AppContext, memories: dict[str, Memory], query_terms: dict[str, float], limit: int
) -> dict[str, float]:
    """BM25 over the remembered items the session sees, terms merged under their stems like the
    chunks' (MADial en, R@5 / R@10 tune .658 / .746 -> .651 / .793, check .542 / .631 -> .543 /
    .700; zh unchanged). The index is kept per process under the set of item ids (an item's text
    never changes: a new value is a new item), so it is built once per change of that set, not
    per request."""
    if not memories:
        return {}
    ids = sorted(memories)
    key = ("memories:" + hashlib.sha256("\n".join(ids).encode()).hexdigest(), 0)
    index = context.lexical_indexes.get(key)
    if not isinstance(index, BM25Index):
        index = BM25Index.from_term_counts(
            _stemmed([(mid, Counter(terms(memories[mid].text))) for mid in ids])
        )
        context.lexical_indexes.put(key, index)
    return lexical_arm(index, query_terms, limit)


async def _memory_vector(
    db: AsyncSession,
    context: AppContext,
    memories: dict[str, Memory],
    query: str,
    qvec: Sequence[float],
    limit: int,
) -> dict[str, float]:
    """Cosine similarity of the closest of `memories` (keyed `memory:<id>`) to `query`, best
    first; an item in another language than the query's is scored as if in its language
    (`app.recall.languages`)."""
    embedder = context.embedder
    if embedder is None or not memories:
        return {}
    ids = [m.id for m in memories.values()]
    texts = {key: m.text for key, m in memories.items()}
    # An item in the other language may rank in only once calibrated: every item is read then
    # (an exact scan of tens to hundreds of rows either way).
    query_in_cjk = mostly_cjk(query)
    mixed = in_other_language(query_in_cjk, texts)
    found = await memories_store.nearest_memories(
        db, ids, embedder.name, embedder.dim, qvec, len(ids) if mixed else limit
    )
    scores = {f"{MEMORY_PREFIX}{mid}": sim for mid, sim in found.items()}
    return calibrated(scores, query_in_cjk, texts, limit) if mixed else scores


def _memory_exact(memories: dict[str, Memory], needles: Sequence[str]) -> list[str]:
    """Items holding one of the query's IDs or quoted strings verbatim (case-insensitive)."""
    folded = [n.casefold() for n in needles if n]
    if not folded:
        return []
    return [mid for mid, m in memories.items() if any(n in m.text.casefold() for n in folded)]


# A query of several lines (a stretch of dialogue, say) is embedded by its last lines: what was
# said last is what the question is about, and encoding costs ~0.8 ms a token, so also embedding
# the whole dialogue (up to the model's 512 tokens) took longer than the 0.7 s query budget on a
# busy machine and left recall lexical only (MADial zh through the API: R@5 .533 instead of .612).
# MADial offline, BM25 + e5 fused as recall does, R@5 tune split (check split): whole + last 3
# lines zh .658 (.562), en .636 (.547); last 3 lines only zh .648 (.567), en .658 (.542); last 2
# lines zh .625, en .623; last 4 lines zh .631, en .595.
QUERY_TAIL_LINES = 3
# "Name: text" (a transcript line): a short label before a colon, then the words said.
_SPEAKER_LINE_RE = re.compile(r"^\s*(?P<speaker>[^:：\n]{1,40}?)\s*[:：]\s*\S")


def query_view(query: str) -> str:
    """What to embed for `query`: itself, or its last `QUERY_TAIL_LINES` lines when longer."""
    lines = [line for line in query.splitlines() if line.strip()]
    if len(lines) <= QUERY_TAIL_LINES:
        return query
    return "\n".join(lines[-QUERY_TAIL_LINES:])


def asker_view(query: str) -> str | None:
    """For a transcript longer than `QUERY_TAIL_LINES` lines (every line "Name: text"), the lines
    of its last line's speaker: what the asker said across the whole dialogue, which the last
    lines alone often miss (the topic was set at the start). None for any other query. MADial
    offline, R@5 tune / check, the two views' similarities averaged against the last lines
    alone: zh .656 / .552 -> .663 / .606, en .673 / .570 -> .678 / .592."""
    lines = [line for line in query.splitlines() if line.strip()]
    if len(lines) <= QUERY_TAIL_LINES:
        return None
    speakers = [
        m.group("speaker") if (m := _SPEAKER_LINE_RE.match(line)) else None for line in lines
    ]
    if None in speakers or len(set(speakers)) < 2:
        return None
    return "\n".join(line for line, who in zip(lines, speakers, strict=True) if who == speakers[-1])


def query_views(query: str) -> list[str]:
    """The texts embedded for `query` (their embeddings averaged): `query_view`, and the
    `asker_view` when there is one."""
    asker = asker_view(query)
    return [query_view(query)] + ([asker] if asker is not None else [])


QUERY_VECTOR_TTL_SECONDS = 24 * 3600


async def _query_vector(
    context: AppContext,
    query: str,
    fallbacks: list[str],
    timeout_s: float | None = None,
    unstored: list[tuple[str, list[float]]] | None = None,
) -> list[float] | None:
    """The query's embedding within `timeout_s` (default: the embedder's query budget), or
    None: lexical recall only, flagged `vector_unavailable` (with `vector_timeout` when the
    budget ran out). After repeated failures or timeouts (not counting those spent queued while
    the embedder answered other queries: `EmbedderBusy`) the circuit breaker skips the embedder
    for a while (`embedder_circuit_open` too), so a hanging embedder costs each build nothing
    rather than its whole budget. A new vector is stored in the cache before it is returned, or
    added to `unstored` for the caller to store later (`QueryVectors.store`)."""
    embedder = context.embedder
    if embedder is None:
        fallbacks.append("vector_unavailable")
        return None
    views = query_views(query)
    digest = hashlib.sha256("\n\x00".join(views).encode()).hexdigest()
    key = context.cache.key("qemb", embedder.name, digest)
    cached = await context.cache.get_json(key)
    if cached is not None:
        return list(cached)
    breaker = context.query_embedder
    if not breaker.allow():
        fallbacks.append("vector_unavailable")
        fallbacks.append("embedder_circuit_open")
        return None
    try:
        embedded = await embedder.embed_queries(views, timeout_s=timeout_s)
        vector: list[float] = l2_normalise(embedded.mean(axis=0, keepdims=True))[0].tolist()
    except asyncio.CancelledError:
        # The build stopped waiting (its other arms failed, or the client left): no verdict on
        # the embedder, and a half-open trial call may be made again.
        breaker.inconclusive()
        raise
    except EmbedderUnavailable as exc:
        if isinstance(exc, EmbedderBusy):
            breaker.inconclusive()  # it answered other queries meanwhile: working, not failing
        else:
            breaker.failed()
        logger.warning("query embedding unavailable, lexical only: %s", type(exc).__name__)
        fallbacks.append("vector_unavailable")
        if isinstance(exc, EmbedderTimeout):
            fallbacks.append("vector_timeout")
        return None
    breaker.succeeded()
    if unstored is None:
        await context.cache.set_json(key, vector, ttl=QUERY_VECTOR_TTL_SECONDS)
    else:
        unstored.append((key, vector))
    return vector


class QueryVectors:
    """The query embeddings of one request, one per text: the first part of the request that
    needs a text's vector (or the request itself, as soon as it knows the text) starts its
    embedding, and every part awaits that one, so a text is embedded once per request and can
    encode while the event loop does other work. Each awaiting part gets the embedding's
    fallbacks in its own list. The owner `cancel`s what is still running when it is done.

    A new vector is stored in the cache by `store`, which the part that searches with it runs
    beside its search and ranking: the store's JSON and round trip were ~1.3 ms of a 1-client
    build's critical path between the embedding and the vector search."""

    def __init__(self, context: AppContext, timeout_s: float | None = None) -> None:
        self._context = context
        self._timeout_s = timeout_s
        self._running: dict[str, asyncio.Task[tuple[list[float] | None, list[str]]]] = {}
        self._unstored: list[tuple[str, list[float]]] = []

    def start(self, text: str) -> None:
        if text not in self._running:
            self._running[text] = asyncio.create_task(self._embed(text))

    async def vector(self, text: str, fallbacks: list[str]) -> list[float] | None:
        self.start(text)
        vector, flags = await self._running[text]
        fallbacks.extend(flags)
        return vector

    def cancel(self) -> None:
        for task in self._running.values():
            task.cancel()

    async def store(self) -> None:
        """Store in the cache the vectors embedded since the last call."""
        while self._unstored:
            key, vector = self._unstored.pop()
            await self._context.cache.set_json(key, vector, ttl=QUERY_VECTOR_TTL_SECONDS)

    async def _embed(self, text: str) -> tuple[list[float] | None, list[str]]:
        flags: list[str] = []
        vector = await _query_vector(self._context, text, flags, self._timeout_s, self._unstored)
        return vector, flags


def early_query_text(context: AppContext, query: str | None) -> str | None:
    """The text recall and the user's items will embed for `query`, when it is known before
    either runs (the query itself when it has enough own terms and no LLM rewrite replaces it;
    see `embedding_query`); None: each finds its text later."""
    if (
        context.embedder is None
        or not query
        or context.settings.recall.rewrite_llm_base_url
        or not own_words_suffice(query)
    ):
        return None
    return query


@dataclass(frozen=True)
class RankedMemory:
    memory: Memory
    score: float  # fused score (relative fusion: 0 .. the arms' summed weights)


async def rank_user_memories(
    db: AsyncSession,
    context: AppContext,
    session: Session,
    query: str,
    fallbacks: list[str],
    query_vectors: QueryVectors | None = None,
) -> list[RankedMemory]:
    """The user-scope remembered items of the session's user, ranked against `query` by the
    arms recall uses for them (exact, BM25, vector), best first; [] without a user_id.
    `query_vectors`: the request's query embeddings, shared with its recall."""
    if not session.user_id:
        return []
    memories = {
        f"{MEMORY_PREFIX}{m.id}": m
        for m in await memories_store.active_visible_memories(db, session, user_scope_only=True)
    }
    if not memories:
        return []
    rewritten = rewrite_query(query, [])
    limit = len(memories)
    lexical = _memory_lexical(context, memories, weighted_terms(query, rewritten), limit)
    vector: dict[str, float] = {}
    qvec = None
    if context.embedder is not None:
        vectors = query_vectors or QueryVectors(context)
        qvec = await vectors.vector(embedding_query(query, rewritten), fallbacks)
    if qvec is not None:
        try:
            async with db.begin_nested():
                vector, _ = await asyncio.gather(
                    _memory_vector(db, context, memories, query, qvec, limit), vectors.store()
                )
        except (EmbedderUnavailable, SQLAlchemyError) as exc:
            logger.warning("vector ranking of user memories unavailable: %s", exc)
            fallbacks.append("vector_unavailable")
    settings = context.settings.recall
    fused = fuse_arms(
        exact=_memory_exact(memories, [*rewritten.ids, *rewritten.quoted]),
        lexical=sorted(lexical, key=lambda d: -lexical[d]),
        vector=list(vector),
        k=settings.rrf_k,
        weights=ArmWeights(settings.weight_exact, settings.weight_lexical, settings.weight_vector),
        method=settings.fusion,
        lexical_scores=lexical,
        vector_scores=vector,
    )
    ranked = [RankedMemory(memories[f.id], round(f.score, 6)) for f in fused]
    seen = {r.memory.id for r in ranked}
    # Items no arm returned (no shared term, no vector yet) follow, newest first.
    rest = sorted((m for m in memories.values() if m.id not in seen), key=lambda m: m.created_at)
    return ranked + [RankedMemory(m, 0.0) for m in reversed(rest)]


async def _rerank(
    context: AppContext,
    query: RewrittenQuery,
    candidates: list[RerankCandidate],
    now_seq: int,
    fallbacks: list[str],
) -> list[ScoredCandidate]:
    """The HTTP cross-encoder when configured (its failure keeps the fused order and is flagged),
    else the deterministic features."""
    settings = context.settings.recall
    if settings.rerank_url and candidates:
        reranker = HttpReranker(
            settings.rerank_url,
            settings.rerank_style,
            model=settings.rerank_model,
            api_key=settings.rerank_api_key,
            timeout_s=settings.rerank_timeout_seconds,
            client=context.http,
        )
        try:
            scores = await reranker.rerank(
                embedding_query(query.raw, query), [c.text for c in candidates]
            )
        except RerankUnavailable as exc:
            logger.warning("rerank unavailable, keeping the fused order: %s", exc)
            fallbacks.append("rerank_unavailable")
            return [
                ScoredCandidate(c, c.fused_score, RerankFeatures(c.fused_score, 0, 0, 0, 0))
                for c in candidates
            ]
        ranked = sorted(zip(candidates, scores, strict=True), key=lambda p: -p[1])
        return [ScoredCandidate(c, s, RerankFeatures(c.fused_score, 0, 0, 0, 0)) for c, s in ranked]
    return feature_rerank(query, candidates, now_seq)


async def _llm_query(
    context: AppContext, query: str, recent_turns: Sequence[str], fallbacks: list[str]
) -> str | None:
    """The LLM rewrite of `query` when configured; its failure is flagged and yields None."""
    settings = context.settings.recall
    if not settings.rewrite_llm_base_url:
        return None
    try:
        return await llm_rewrite(
            context.http,
            settings.rewrite_llm_base_url,
            settings.rewrite_llm_model,
            settings.rewrite_llm_api_key,
            query,
            recent_turns,
            settings.rewrite_llm_timeout_seconds,
        )
    except QueryRewriteUnavailable as exc:
        logger.warning("LLM query rewrite unavailable, keeping the rule rewrite: %s", exc)
        fallbacks.append("rewrite_unavailable")
        return None


async def recall(
    db: AsyncSession,
    context: AppContext,
    session: Session,
    query: str,
    *,
    recent_turns: Sequence[str],
    candidates: int,
    window_seqs: Collection[int] = frozenset(),
    include_memories: bool = True,
    now: datetime | None = None,
    query_timeout_s: float | None = None,
    query_vectors: QueryVectors | None = None,
) -> RecallOutcome:
    """Ranked history relevant to `query` (chunks, and remembered items when asked); `now` is
    the time of the conversation's latest turn (relative dates in the query count from it);
    `query_timeout_s` bounds the wait for the query's embedding (default: the embedder's);
    `query_vectors`: the request's query embeddings (its budget then applies), which may have
    started this query's already.

    The network waits (LLM rewrite, query embedding, HTTP rerank) happen outside any
    transaction: recall ends the caller's transaction before each (`release`), so callers
    call it with nothing left to write."""
    clock = _Clock()
    fallbacks: list[str] = []
    at = now or datetime.now(UTC)
    rewritten, query_terms, dates = await off_loop(
        lambda: _rule_rewrite(query, recent_turns, at),
        chars=len(query) + sum(len(turn) for turn in recent_turns),
    )
    clock.lap("rewrite")
    await release(db)
    llm_query = await _llm_query(context, query, recent_turns, fallbacks)
    if llm_query is not None:
        rewritten = replace(rewritten, rewritten=llm_query)
        query_terms = weighted_terms(query, rewritten, llm_query)
    query_terms.update(dict.fromkeys(dates, 1.0))
    if context.settings.recall.rewrite_llm_base_url:
        clock.lap("rewrite_llm")
    # The query's embedding runs on its encoder lane while the arms that do not need it
    # (exact, lexical, remembered items) run here.
    vectors = query_vectors or QueryVectors(context, query_timeout_s)
    embedded = llm_query or embedding_query(query, rewritten)
    vectors.start(embedded)
    others: asyncio.Future[repository.RecallRows] | None = None
    vectors_read: asyncio.Future[dict[str, np.ndarray]] | None = None
    try:
        exact = await _exact(context, session, [*rewritten.ids, *rewritten.quoted], candidates)
        clock.lap("exact")
        kept = await _session_chunks(db, context, session)
        if context.embedder is not None and _scans_in_process(context, session):
            vectors_read = _missing_vectors(context, session, kept, context.embedder.name)
        lexical = lexical_arm(kept.index, query_terms, candidates)
        clock.lap("lexical")
        # The exact and lexical candidates' rows are read while the query embeds: after it, the
        # vector arm's statement reads only its own chunks' rows (the 30 lexical candidates' rows
        # were half of that statement's 2.5 ms).
        wanted = [*exact, *lexical]
        others = asyncio.ensure_future(
            read_once(
                context.reader,
                lambda conn: repository.nearest_and_shown(
                    conn, session.id, "", None, candidates, wanted
                ),
            )
        )
        memories: dict[str, Memory] = {}
        memory_lexical: dict[str, float] = {}
        if include_memories:
            memories = {
                f"{MEMORY_PREFIX}{m.id}": m
                for m in await memories_store.active_visible_memories(db, session)
            }
            memory_lexical = _memory_lexical(context, memories, query_terms, candidates)
            clock.lap("memories")
        await release(db)  # the embedding may be a network wait
        qvec = await vectors.vector(embedded, fallbacks)
    except BaseException:
        for read in (others, vectors_read):
            _discard(read)
        raise
    finally:
        if query_vectors is None:  # only when an arm above failed: the embedding is not wanted
            vectors.cancel()
    clock.lap("embed")

    # The new query vector's store (a Redis round trip) overlaps the ranking below: with the
    # vector arm in process nothing else waits on I/O here. The cache logs its own failures.
    stored = asyncio.ensure_future(vectors.store())
    rows = await _nearest_and_shown(
        context, session, kept, qvec, candidates, others, vectors_read, fallbacks, query
    )
    vector = rows.nearest
    memory_vector: dict[str, float] = {}
    if qvec is not None and memories:
        try:
            async with db.begin_nested():
                memory_vector = await _memory_vector(db, context, memories, query, qvec, candidates)
        except (EmbedderUnavailable, SQLAlchemyError) as exc:
            logger.warning("vector ranking of remembered items unavailable: %s", exc)
            if "vector_unavailable" not in fallbacks:
                fallbacks.append("vector_unavailable")
    if qvec is not None:
        clock.lap("vector")

    weights = ArmWeights(
        exact=context.settings.recall.weight_exact,
        lexical=context.settings.recall.weight_lexical,
        vector=context.settings.recall.weight_vector,
    )
    memory_exact = _memory_exact(memories, [*rewritten.ids, *rewritten.quoted])
    # Chunks and remembered items are ranked by different BM25 indexes, whose scores are not
    # comparable: each corpus is normalised on its own. Cosine similarities come from one
    # embedder and are comparable as they are.
    lexical_all = {**_normalised(lexical), **_normalised(memory_lexical)}
    vector_all = {**vector, **memory_vector}
    fused = fuse_arms(
        exact=[*exact, *memory_exact],
        lexical=sorted(lexical_all, key=lambda d: -lexical_all[d]),
        vector=sorted(vector_all, key=lambda d: -vector_all[d]),
        k=context.settings.recall.rrf_k,
        weights=weights,
        method=context.settings.recall.fusion,
        lexical_scores=lexical_all,
        vector_scores=vector_all,
    )
    vector_median = statistics.median(vector_all.values()) if vector_all else 0.0
    clock.lap("fuse")

    chunks = rows.shown
    fields: dict[str, dict[str, Any]] = {}
    for f in fused:
        if f.id.startswith(MEMORY_PREFIX):
            m = memories[f.id]
            fields[f.id] = {
                "turn_first": None,
                "turn_last": None,
                "ts": m.created_at,
                "text": m.text,
                "trusted": m.trusted,
                "part": 1,
                "parts": 1,
                "text_tokens": None,
            }
        elif f.id in chunks and chunks[f.id].status == "active":
            fields[f.id] = _chunk_fields(chunks[f.id])
    answered = await _results_of_calls(db, session, fused, fields)
    if answered:
        fused = with_results_of_calls(fused, answered)
        for result in answered.values():
            fields.setdefault(result.chunk.id, _chunk_fields(result.chunk))
        clock.lap("results_of_calls")
    by_id = {f.id: f for f in fused if f.id in fields}
    rerank_input = [
        RerankCandidate(
            id=f.id,
            text=fields[f.id]["text"],
            fused_score=f.score,
            fused_rank=f.rank,
            turn_last=fields[f.id]["turn_last"] or 0,
            turn_first=fields[f.id]["turn_first"] or 0,
            ranged=not f.id.startswith(MEMORY_PREFIX),
            call_text=answered[f.id].call.text if f.id in answered else "",
        )
        for f in fused
        if f.id in fields
    ]
    if context.settings.recall.rerank_url:
        await release(db)  # the cross-encoder is a network wait
    scored = await _rerank(context, rewritten, rerank_input, session.last_seq, fallbacks)
    clock.lap("rerank")

    groups = {
        cid: f"turn:{fields[cid]['turn_first']}" for cid in fields if fields[cid]["parts"] > 1
    }
    rangeless = {cid for cid in fields if cid.startswith(MEMORY_PREFIX)}
    selection = select_within_budget(
        scored,
        k=len(scored),
        budget_tokens=None,
        window_seqs=window_seqs,
        overlap_groups=groups,
        rangeless=rangeless,
        text_keys={
            cid: kept.text_key(cid, f["text"]) for cid, f in fields.items() if cid not in rangeless
        },
        keyed_pieces={s.id for s in scored if s.id in groups and s.features.exact > 0},
    )

    def hit(item: ScoredCandidate) -> RecallHit:
        f = fields[item.id]
        return RecallHit(
            id=item.id,
            source="memory" if item.id in rangeless else "chunk",
            turn_first=f["turn_first"],
            turn_last=f["turn_last"],
            ts=f["ts"],
            text=f["text"],
            trusted=f["trusted"],
            score=round(item.score, 6),
            fused=by_id[item.id],
            features=item.features,
            vector_margin=(
                round(vector_all[item.id] - vector_median, 6) if item.id in vector_all else None
            ),
            part=f["part"],
            parts=f["parts"],
            text_tokens=f["text_tokens"],
        )

    clock.lap("select")
    await stored
    return RecallOutcome(
        query=rewritten,
        hits=[hit(s) for s in selection.selected],
        dropped=[(hit(s), reason) for s, reason in selection.dropped],
        fallbacks=fallbacks,
        timings_ms=clock.timings,
        candidates=len(fused),
        query_terms=query_terms,
    )
