"""Remembered items in recall: their lexical, vector and exact arms, and the user-scope items
ranked by the same arms for a build (`rank_user_memories`)."""

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.context import AppContext
from app.domain.text import mostly_cjk, terms
from app.embeddings.base import EmbedderUnavailable
from app.recall.arms import lexical_arm
from app.recall.bm25 import BM25Index
from app.recall.hits import MEMORY_PREFIX
from app.recall.languages import calibrated, in_other_language
from app.recall.query import embedding_query, weighted_terms
from app.recall.query_vectors import QueryVectors
from app.recall.ranking import fuse
from app.recall.rewrite import rewrite_query
from app.recall.session_chunks import stemmed
from app.store import memories as memories_store
from app.store.models import Memory, Session

logger = logging.getLogger("contextd.recall")


def memory_lexical_arm(
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
            stemmed([(mid, Counter(terms(memories[mid].text))) for mid in ids])
        )
        context.lexical_indexes.put(key, index)
    return lexical_arm(index, query_terms, limit)


async def memory_vector_arm(
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
    tenant_id = next(iter(memories.values())).tenant_id  # the session's: all it sees are
    found = await memories_store.nearest_memories(
        db, tenant_id, ids, embedder.name, embedder.dim, qvec, len(ids) if mixed else limit
    )
    scores = {f"{MEMORY_PREFIX}{mid}": sim for mid, sim in found.items()}
    return calibrated(scores, query_in_cjk, texts, limit) if mixed else scores


def memory_exact_arm(memories: dict[str, Memory], needles: Sequence[str]) -> list[str]:
    """Items holding one of the query's IDs or quoted strings verbatim (case-insensitive)."""
    folded = [n.casefold() for n in needles if n]
    if not folded:
        return []
    return [mid for mid, m in memories.items() if any(n in m.text.casefold() for n in folded)]


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
    lexical = memory_lexical_arm(context, memories, weighted_terms(query, rewritten), limit)
    vector: dict[str, float] = {}
    qvec = None
    if context.embedder is not None:
        vectors = query_vectors or QueryVectors(context)
        qvec = await vectors.vector(embedding_query(query, rewritten), fallbacks)
    if qvec is not None:
        try:
            async with db.begin_nested():
                vector, _ = await asyncio.gather(
                    memory_vector_arm(db, context, memories, query, qvec, limit), vectors.store()
                )
        except (EmbedderUnavailable, SQLAlchemyError) as exc:
            logger.warning("vector ranking of user memories unavailable: %s", exc)
            fallbacks.append("vector_unavailable")
    fused = fuse(
        context.settings.recall,
        memory_exact_arm(memories, [*rewritten.ids, *rewritten.quoted]),
        lexical,
        vector,
    )
    ranked = [RankedMemory(memories[f.id], round(f.score, 6)) for f in fused]
    seen = {r.memory.id for r in ranked}
    # Items no arm returned (no shared term, no vector yet) follow, newest first.
    rest = sorted((m for m in memories.values() if m.id not in seen), key=lambda m: m.created_at)
    return ranked + [RankedMemory(m, 0.0) for m in reversed(rest)]
