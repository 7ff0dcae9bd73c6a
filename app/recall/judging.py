"""Recall's hits judged against the relevance floor (`app.recall.floor`): each hit's relevance
and the floor that applies.

The floor's signals are computed here and passed to its pure functions: the query's term weights
over the session's chunks, each hit's vector similarity and, for the memory tool's recall, the
two similarities of `floor.meaning_relevance` for the first hits that hold lines in the other
script than the question's, and, when the question asks about the user, for those whose user
turns hold lines in its own: the hit's e5 similarity to the unadapted query vector (its vector
from those this process keeps for the in-process scan, else read) and the multilingual Universal
Sentence Encoder's similarity of the question and each of those lines
(`AppContext.meaning`, loaded on the first such judgement). Nothing is computed while
the floor is off, and by meaning only for the memory tool's recall (a build keeps its block
whatever the floor says): ~2 ms a line with USE on one core (the lines' vectors are kept), so a
session in one script pays only for questions about the user.
"""

import logging
from collections.abc import Sequence

import numpy as np
import psycopg
from sqlalchemy.exc import SQLAlchemyError

from app.core.context import AppContext
from app.core.db import read_once
from app.embeddings.base import EmbedderUnavailable, l2_normalise
from app.recall.adapter import packaged_adapter
from app.recall.floor import (
    CONFIDENT_WITHIN,
    RelevanceJudge,
    asks_about_the_user,
    compared_lines,
    meaning_relevance,
    query_weights,
)
from app.recall.hits import RecallHit
from app.recall.session_chunks import SessionChunks
from app.store import chunks as chunks_store
from app.store.models import Session

logger = logging.getLogger("contextd.recall")

# A long tool result holds hundreds of lines: its first ones say what it is, and encoding every
# one would cost more than the rest of recall.
MAX_LINES_AN_ITEM = 20


async def judged(
    context: AppContext,
    session: Session,
    query: str,
    *,
    dated: bool,
    kept: SessionChunks,
    query_vector: Sequence[float] | None,
    hits: Sequence[RecallHit],
    by_meaning: bool,
) -> tuple[RelevanceJudge | None, float]:
    """The judge of the hits' relevance (None: the floor is off) and the floor that applies:
    judged on `query` (the caller's own words, or the LLM's rewrite of them), weighted by the
    session's term statistics; no floor with another embedder than the one the floor's
    similarity scale was calibrated on. `query_vector`: the query's embedding before the
    adapter (None: it timed out, and nothing is judged by meaning). `by_meaning`: judge the
    first hits by meaning too, with USE (only the memory tool asks): those in the other script,
    and, for a question about the user, those in its own."""
    floor = context.settings.recall.relevance_floor
    if floor <= 0:
        return None, 0.0
    weights = query_weights(query, kept.index.df, len(kept.index), dated=dated)
    scaled = _similarity_calibrated(context)
    meant = (
        await _by_meaning(
            context, session, kept, query, query_vector, hits, asks_about_the_user(query)
        )
        if scaled and by_meaning
        else {}
    )
    return (
        RelevanceJudge(weights, scaled, meant),
        floor if scaled or context.embedder is None else 0.0,
    )


def _similarity_calibrated(context: AppContext) -> bool:
    """Whether the chunks' vector similarities are on the scale the floor was calibrated on:
    the packaged query adapter's embedder, adapter on (another embedder's similarities, or
    unadapted ones, sit elsewhere: an 8-dimension test embedder's unrelated texts reach 0.9)."""
    embedder = context.embedder
    return (
        context.settings.recall.query_adapter
        and embedder is not None
        and embedder.name == packaged_adapter().model
    )


async def _by_meaning(
    context: AppContext,
    session: Session,
    kept: SessionChunks,
    query: str,
    query_vector: Sequence[float] | None,
    hits: Sequence[RecallHit],
    own_script: bool,
) -> dict[str, float]:
    """`floor.meaning_relevance` of each of the first `CONFIDENT_WITHIN` chunk hits that holds
    lines in the other script than `query`, or, with `own_script`, user lines in its own, by
    hit id: the best of its lines. Empty when no encoder is loaded, the query has no vector, or
    either encoder or the vectors' read fails (logged: the floor then judges those hits
    without it)."""
    embedder = context.embedder
    if embedder is None or query_vector is None:
        return {}
    lines = {
        hit.id: _compared(query, hit.text, own_script)
        for hit in hits[:CONFIDENT_WITHIN]
        if hit.source == "chunk"
    }
    lines = {hit_id: held for hit_id, held in lines.items() if held}
    if not lines:
        return {}
    encoder = await context.meaning.get()
    if encoder is None:
        return {}
    texts = list(dict.fromkeys(line for held in lines.values() for line, _ in held))
    known: dict[str, np.ndarray] = {}
    for text in texts:
        vector = context.meaning_lines.get(text)
        if vector is not None:
            known[text] = vector
    new = [text for text in texts if text not in known]
    try:
        vectors = await _chunk_vectors(context, session, kept, embedder.name, list(lines))
        encoded = await encoder.embed_queries(
            [query, *new], timeout_s=context.settings.embedding.query_timeout_seconds
        )
    except (EmbedderUnavailable, SQLAlchemyError, psycopg.Error) as exc:
        logger.warning("relevance by meaning unavailable: %s", exc)
        return {}
    for text, vector in zip(new, encoded[1:], strict=True):
        context.meaning_lines.put(text, vector)
        known[text] = vector
    line_similarity = {text: float(vector @ encoded[0]) for text, vector in known.items()}
    judged_ids = [hit_id for hit_id in lines if hit_id in vectors]
    if not judged_ids:
        return {}
    units = l2_normalise(np.stack([vectors[hit_id] for hit_id in judged_ids]))
    e5_similarity = units @ l2_normalise(np.asarray([query_vector]))[0]
    return {
        hit_id: max(
            meaning_relevance(float(similarity), line_similarity[line], across=across)
            for line, across in lines[hit_id]
        )
        for hit_id, similarity in zip(judged_ids, e5_similarity, strict=True)
    }


def _compared(query: str, text: str, own_script: bool) -> list[tuple[str, bool]]:
    """The lines of `text` to compare with `query` by meaning, each with whether it is in the
    other script: those in the other script, and, with `own_script`, the user's in its own."""
    pairs = [(line, True) for line in compared_lines(query, text, across=True)]
    if own_script:
        pairs += [(line, False) for line in compared_lines(query, text, across=False)]
    return pairs[:MAX_LINES_AN_ITEM]


async def _chunk_vectors(
    context: AppContext, session: Session, kept: SessionChunks, model: str, ids: list[str]
) -> dict[str, np.ndarray]:
    """The e5 vectors of chunks `ids`: those this process keeps, the others read."""
    held = kept.vectors.of(ids) if kept.vectors is not None else {}
    missing = [cid for cid in ids if cid not in held]
    if not missing:
        return held
    read = await read_once(
        context.reader,
        lambda conn: chunks_store.chunk_vectors(
            conn, session.tenant_id, session.id, model, missing
        ),
    )
    return {**held, **read}
