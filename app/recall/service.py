"""The recall chain: rewrite → exact hits → embed → wide recall (BM25 + vector) → fusion
(`app.recall.fusion`) → rerank → drop what is already in the window and duplicates. Callers then
cut to k and a token budget.

Every arm degrades on its own: an embedder or vector failure leaves lexical recall
(`vector_unavailable`), a rerank failure the fused order (`rerank_unavailable`), an optional LLM
rewrite failure the rule-based rewrite (`rewrite_unavailable`).

`recall` reads as its phases; each phase's work lives in its own module: the query
(`query`, `query_vectors`), the arms over chunks (`arms`, over `session_chunks`) and over
remembered items (`memory_arms`), tool results (`tool_results`), fusion, rerank and selection
(`ranking`), and the hits (`hits`).
"""

import asyncio
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import RecallSettings
from app.core.context import AppContext
from app.core.cpu import off_loop
from app.core.db import read_once, release
from app.embeddings.base import EmbedderUnavailable
from app.recall.arms import (
    discard,
    exact_arm,
    lexical_arm,
    missing_vectors,
    scans_in_process,
    vector_arm_and_rows,
)
from app.recall.floor import RelevanceJudge
from app.recall.fusion import FusedCandidate
from app.recall.hits import MEMORY_PREFIX, Clock, RecallHit, RecallOutcome, hits_of
from app.recall.judging import judged
from app.recall.memory_arms import memory_exact_arm, memory_lexical_arm, memory_vector_arm
from app.recall.query import embedding_query, rule_rewrite, weighted_terms
from app.recall.query_vectors import QueryVectors, rewrite_with_llm
from app.recall.ranking import (
    candidate_fields,
    chunk_fields,
    fuse,
    normalised,
    rerank,
    rerank_input,
    select,
)
from app.recall.rewrite import RewrittenQuery
from app.recall.session_chunks import SessionChunks, kept_chunks
from app.recall.tool_results import ResultOfCall, results_of_calls, with_results_of_calls
from app.store import chunks as chunks_store
from app.store import memories as memories_store
from app.store.models import Memory, Session

logger = logging.getLogger("contextd.recall")


@dataclass(frozen=True)
class Understood:
    """The query as recall searches with it: rewritten, its BM25 weights (date terms added),
    and the LLM's rewrite when there is one."""

    rewritten: RewrittenQuery
    terms: dict[str, float]
    llm_query: str | None
    dated: bool = False  # the query names a day or month


@dataclass(frozen=True)
class FirstArms:
    """The arms that do not need the query vector, and what was started while it embedded."""

    exact: list[str]
    kept: SessionChunks
    lexical: dict[str, float]
    # Reads started while the query embeds: the rows of the exact and lexical candidates, and
    # the vectors this process does not hold yet (None unless the vector arm scans in process).
    others: "asyncio.Future[chunks_store.RecallRows]"
    vectors_read: "asyncio.Future[dict[str, np.ndarray]] | None"
    memories: dict[str, Memory]
    memory_lexical: dict[str, float]
    qvec: list[float] | None


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
    by_meaning: bool = False,
) -> RecallOutcome:
    """Ranked history relevant to `query` (chunks, and remembered items when asked); `now` is
    the time of the conversation's latest turn (relative dates in the query count from it);
    `query_timeout_s` bounds the wait for the query's embedding (default: the embedder's);
    `query_vectors`: the request's query embeddings (its budget then applies), which may have
    started this query's already. `by_meaning`: also judged by meaning (the tool's).

    The network waits (LLM rewrite, query embedding, HTTP rerank) happen outside any
    transaction: recall ends the caller's transaction before each (`release`), so callers
    call it with nothing left to write."""
    clock = Clock()
    fallbacks: list[str] = []
    understood = await _understand(db, context, query, recent_turns, now, fallbacks, clock)
    # The query's embedding runs on its encoder lane while the arms that do not need it
    # (exact, lexical, remembered items) run here.
    vectors = query_vectors or QueryVectors(context, query_timeout_s)
    embedded = understood.llm_query or embedding_query(query, understood.rewritten)
    vectors.start(embedded)
    first = await _arms_before_vector(
        db,
        context,
        session,
        understood,
        vectors,
        embedded,
        candidates,
        include_memories,
        own_vectors=query_vectors is None,
        fallbacks=fallbacks,
        clock=clock,
    )
    # The new query vector's store (a Redis round trip) overlaps the ranking below: with the
    # vector arm in process nothing else waits on I/O here. The cache logs its own failures.
    stored = asyncio.ensure_future(vectors.store())
    rows, memory_vector = await _vector_arms(
        db, context, session, query, first, candidates, fallbacks, clock
    )
    fused, vector_all = _fused(
        context.settings.recall, understood.rewritten, first, rows.nearest, memory_vector
    )
    clock.lap("fuse")
    fused, fields, answered = await _candidates(db, session, fused, first.memories, rows, clock)
    by_id = {f.id: f for f in fused if f.id in fields}
    reranked = rerank_input(fused, fields, answered)
    if context.settings.recall.rerank_url or context.settings.recall.cross_encoder != "off":
        await release(db)  # a cross-encoder is a network wait, or CPU in a thread
    scored = await rerank(context, understood.rewritten, reranked, session.last_seq, fallbacks)
    clock.lap("rerank")
    rangeless = {cid for cid in fields if cid.startswith(MEMORY_PREFIX)}
    selection = select(scored, fields, rangeless, first.kept, window_seqs)
    clock.lap("select")
    await stored
    hits, dropped = hits_of(selection, fields, by_id, rangeless, vector_all)
    judge, floor = await _judge(context, session, query, understood, first, hits, by_meaning)
    return RecallOutcome(
        query=understood.rewritten,
        hits=hits,
        dropped=dropped,
        fallbacks=fallbacks,
        timings_ms=clock.timings,
        candidates=len(fused),
        query_terms=understood.terms,
        floor=floor,
        judge=judge,
    )


async def _judge(
    context: AppContext,
    session: Session,
    query: str,
    understood: Understood,
    first: FirstArms,
    hits: list[RecallHit],
    by_meaning: bool,
) -> tuple[RelevanceJudge | None, float]:
    """The judge of the hits' relevance and the floor (`app.recall.judging`), on the caller's
    own words, or the LLM's rewrite of them."""
    return await judged(
        context,
        session,
        understood.llm_query or query,
        dated=understood.dated,
        kept=first.kept,
        query_vector=first.qvec,
        hits=hits,
        by_meaning=by_meaning,
    )


async def _understand(
    db: AsyncSession,
    context: AppContext,
    query: str,
    recent_turns: Sequence[str],
    now: datetime | None,
    fallbacks: list[str],
    clock: Clock,
) -> Understood:
    """The rule rewrite (off the event loop for long text), then the LLM rewrite when
    configured (outside the transaction), and the query's weighted terms with its date terms."""
    at = now or datetime.now(UTC)
    rewritten, query_terms, dates = await off_loop(
        lambda: rule_rewrite(query, recent_turns, at),
        chars=len(query) + sum(len(turn) for turn in recent_turns),
    )
    clock.lap("rewrite")
    await release(db)
    llm_query = await rewrite_with_llm(context, query, recent_turns, fallbacks)
    if llm_query is not None:
        rewritten = replace(rewritten, rewritten=llm_query)
        query_terms = weighted_terms(query, rewritten, llm_query)
    query_terms.update(dict.fromkeys(dates, 1.0))
    if context.settings.recall.rewrite_llm_base_url:
        clock.lap("rewrite_llm")
    return Understood(rewritten, query_terms, llm_query, dated=bool(dates))


async def _arms_before_vector(
    db: AsyncSession,
    context: AppContext,
    session: Session,
    understood: Understood,
    vectors: QueryVectors,
    embedded: str,
    candidates: int,
    include_memories: bool,
    *,
    own_vectors: bool,
    fallbacks: list[str],
    clock: Clock,
) -> FirstArms:
    """The exact, lexical and remembered items' lexical arms while the query embeds, the reads
    the vector arm will need started, then the query vector (outside the transaction). When an
    arm fails, the reads are discarded and the embedding is cancelled (unless the request owns
    it: `own_vectors` false)."""
    rewritten, query_terms = understood.rewritten, understood.terms
    others: asyncio.Future[chunks_store.RecallRows] | None = None
    vectors_read: asyncio.Future[dict[str, np.ndarray]] | None = None
    try:
        exact = await exact_arm(context, session, [*rewritten.ids, *rewritten.quoted], candidates)
        clock.lap("exact")
        kept = await kept_chunks(db, context, session)
        if context.embedder is not None and scans_in_process(context, session):
            vectors_read = missing_vectors(context, session, kept, context.embedder.name)
        lexical = lexical_arm(kept.index, query_terms, candidates)
        clock.lap("lexical")
        # The exact and lexical candidates' rows are read while the query embeds: after it, the
        # vector arm's statement reads only its own chunks' rows (the 30 lexical candidates' rows
        # were half of that statement's 2.5 ms).
        wanted = [*exact, *lexical]
        others = asyncio.ensure_future(
            read_once(
                context.reader,
                lambda conn: chunks_store.nearest_and_shown(
                    conn, session.tenant_id, session.id, "", None, candidates, wanted
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
            memory_lexical = memory_lexical_arm(context, memories, query_terms, candidates)
            clock.lap("memories")
        await release(db)  # the embedding may be a network wait
        qvec = await vectors.vector(embedded, fallbacks)
    except BaseException:
        for read in (others, vectors_read):
            discard(read)
        raise
    finally:
        if own_vectors:  # only when an arm above failed: the embedding is not wanted
            vectors.cancel()
    clock.lap("embed")
    return FirstArms(exact, kept, lexical, others, vectors_read, memories, memory_lexical, qvec)


async def _vector_arms(
    db: AsyncSession,
    context: AppContext,
    session: Session,
    query: str,
    first: FirstArms,
    candidates: int,
    fallbacks: list[str],
    clock: Clock,
) -> tuple[chunks_store.RecallRows, dict[str, float]]:
    """The chunks' vector arm with the rows of every arm's candidates, and the remembered
    items' vector arm (in a savepoint: its failure leaves their lexical arm)."""
    qvec = first.qvec
    rows = await vector_arm_and_rows(
        context,
        session,
        first.kept,
        qvec,
        candidates,
        first.others,
        first.vectors_read,
        fallbacks,
        query,
    )
    memory_vector: dict[str, float] = {}
    if qvec is not None and first.memories:
        try:
            async with db.begin_nested():
                memory_vector = await memory_vector_arm(
                    db, context, first.memories, query, qvec, candidates
                )
        except (EmbedderUnavailable, SQLAlchemyError) as exc:
            logger.warning("vector ranking of remembered items unavailable: %s", exc)
            if "vector_unavailable" not in fallbacks:
                fallbacks.append("vector_unavailable")
    if qvec is not None:
        clock.lap("vector")
    return rows, memory_vector


def _fused(
    settings: RecallSettings,
    rewritten: RewrittenQuery,
    first: FirstArms,
    vector: dict[str, float],
    memory_vector: dict[str, float],
) -> tuple[list[FusedCandidate], dict[str, float]]:
    """Chunks and remembered items fused, and the vector arms' similarities together."""
    memory_exact = memory_exact_arm(first.memories, [*rewritten.ids, *rewritten.quoted])
    # Chunks and remembered items are ranked by different BM25 indexes, whose scores are not
    # comparable: each corpus is normalised on its own. Cosine similarities come from one
    # embedder and are comparable as they are.
    lexical_all = {**normalised(first.lexical), **normalised(first.memory_lexical)}
    vector_all = {**vector, **memory_vector}
    by_similarity = dict(sorted(vector_all.items(), key=lambda p: -p[1]))
    fused = fuse(settings, [*first.exact, *memory_exact], lexical_all, by_similarity)
    return fused, vector_all


async def _candidates(
    db: AsyncSession,
    session: Session,
    fused: list[FusedCandidate],
    memories: dict[str, Memory],
    rows: chunks_store.RecallRows,
    clock: Clock,
) -> tuple[list[FusedCandidate], dict[str, dict[str, Any]], dict[str, ResultOfCall]]:
    """The fused candidates with their fields, and the chunks holding the results of the tool
    calls among the first of them, ranked with their calls (`app.recall.tool_results`)."""
    fields = candidate_fields(fused, memories, rows.shown)
    answered = await results_of_calls(db, session, fused, fields)
    if answered:
        fused = with_results_of_calls(fused, answered)
        for result in answered.values():
            fields.setdefault(result.chunk.id, chunk_fields(result.chunk))
        clock.lap("results_of_calls")
    return fused, fields, answered
