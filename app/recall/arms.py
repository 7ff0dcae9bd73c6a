"""The chunk arms of recall: exact (IDs and quoted strings), lexical (BM25 over the session's
index) and vector (a scan in process, one statement on the reader pool, or the session's own
HNSW index), with the rows of their candidates."""

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
from sqlalchemy.exc import SQLAlchemyError

from app.core.context import AppContext
from app.core.db import read_once
from app.domain.stem import by_stem
from app.domain.text import match_terms, mostly_cjk
from app.recall.adapter import chunk_query_vector
from app.recall.bm25 import BM25Index
from app.recall.languages import ADAPTED_OFFSETS, RAW_OFFSETS, calibrated, in_other_language
from app.recall.session_chunks import SessionChunks
from app.store import chunks as chunks_store
from app.store import vector_index as vector_index_store
from app.store.models import Session

logger = logging.getLogger("contextd.recall")

# A vector scan over more than this many bytes of vectors runs in a worker thread (numpy releases
# the GIL): ~2,700 chunks of 384 dimensions, about 0.2 ms of scan.
INLINE_SCAN_BYTES = 4 * 2**20


def _vector_index(
    context: AppContext, session: Session
) -> vector_index_store.VectorIndexScan | None:
    """A large session is searched through its own HNSW index (once the worker built it)."""
    settings = context.settings.recall
    if context.embedder is None or session.chunk_count < settings.vector_index_min_chunks:
        return None
    return vector_index_store.VectorIndexScan(context.embedder.dim, settings.vector_index_ef_search)


def scans_in_process(context: AppContext, session: Session) -> bool:
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


def missing_vectors(
    context: AppContext, session: Session, chunks: SessionChunks, model: str
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
            lambda conn: chunks_store.chunk_vectors(
                conn, session.tenant_id, session.id, model, unvectored
            ),
        )
    )


async def _scan_in_process(
    chunks: SessionChunks,
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


async def exact_arm(
    context: AppContext, session: Session, needles: Sequence[str], limit: int
) -> list[str]:
    """The exact arm (`chunks_store.exact_hits`, on the reader pool): only a query holding an ID or
    a quoted string reads anything."""
    if not needles:
        return []
    return await read_once(
        context.reader,
        lambda conn: chunks_store.exact_hits(conn, session.tenant_id, session.id, needles, limit),
    )


def discard(read: "asyncio.Future[Any] | None") -> None:
    """Cancel a read no longer wanted; one that failed already has its error taken (not logged
    as never retrieved: the build reported or did without it)."""
    if read is not None and not read.cancel() and not read.cancelled():
        read.exception()


async def _shown_rows(
    context: AppContext, session: Session, ids: list[str]
) -> dict[str, chunks_store.ShownChunk]:
    """What recall shows of the session's chunks `ids` (any status), read on the reader pool."""
    rows = await read_once(
        context.reader,
        lambda conn: chunks_store.nearest_and_shown(conn, *session.key, "", None, len(ids), ids),
    )
    return rows.shown


async def vector_arm_and_rows(
    context: AppContext,
    session: Session,
    chunks: SessionChunks,
    qvec: Sequence[float] | None,
    limit: int,
    others: "asyncio.Future[chunks_store.RecallRows]",
    vectors_read: "asyncio.Future[dict[str, np.ndarray]] | None",
    fallbacks: list[str],
    query: str,
) -> chunks_store.RecallRows:
    """The vector arm (with a query vector) and the shown rows of its chunks, with `others` (the
    shown rows of the other arms' candidates, being read meanwhile). The arm is a scan in
    process when the session's is (`scans_in_process`: then `vectors_read` is the read of the
    vectors not held yet, None otherwise); otherwise on the reader pool, one statement when the
    session is searched by an exact scan. Its chunks' rows come from those this process keeps
    (`chunks.rows`) when it keeps any: the scan then returns ids and distances, and only the
    rows of chunks not kept are read. A session with its own HNSW index is searched through it
    (`repository.nearest_through_index`). A failing vector arm leaves lexical recall
    (`vector_unavailable`). For a Chinese `query` the candidates in another language are
    scored as in its (`app.recall.languages`)."""
    embedder = context.embedder
    found: dict[str, float] = {}
    near: dict[str, chunks_store.ShownChunk] = {}
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
                        lambda conn: chunks_store.nearest_and_shown(
                            conn, *session.key, embedder.name, qvec, limit, [], chunks.rows.keys()
                        ),
                    )
                    found, near = rows.nearest, rows.shown
                else:
                    rows = await read_once(
                        context.reader,
                        lambda conn: vector_index_store.nearest_through_index(
                            conn, *session.key, embedder.name, qvec, limit, index
                        ),
                    )
                    found, near = rows.nearest, rows.shown
            except (SQLAlchemyError, psycopg.Error) as exc:
                logger.warning("vector recall unavailable, lexical only: %s", exc)
                fallbacks.append("vector_unavailable")
        known = (await others).shown
    finally:
        for read in (others, vectors_read):  # read already, unless the vector arm raised
            discard(read)
    for cid in found:
        kept = None if cid in near else chunks.row(cid)
        if kept is not None:
            near[cid] = kept  # active: the vector arm returns active chunks only
    missing = [cid for cid in found if cid not in near and cid not in known]
    if missing:
        near = {**near, **await _shown_rows(context, session, missing)}
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
    return chunks_store.RecallRows(found, shown)


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
