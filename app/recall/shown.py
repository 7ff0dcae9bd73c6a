"""The best hits with a compact version each: the chunk cut down to the turns that answer the
query, which the assembler uses when the whole chunk does not fit."""

from dataclasses import replace

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.context import AppContext
from app.core.db import read_once
from app.domain.stem import by_stem
from app.domain.turn_text import render_turn
from app.recall.bm25 import idf
from app.recall.hits import RecallHit, RecallOutcome
from app.recall.session_chunks import ChunkLines, kept_chunks
from app.recall.trim import trim_chunk
from app.store import turns as turns_store
from app.store.models import Session


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
    chunks = await kept_chunks(db, context, session)
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
            lambda conn: turns_store.turns_of_chunks(conn, session.tenant_id, session.id, wanted),
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
