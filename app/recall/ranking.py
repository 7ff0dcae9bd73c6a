"""How recall orders its candidates: the arms fused (`fuse`), the fields each candidate is shown
with, the rerank (an HTTP cross-encoder, or the features of `app.recall.rerank`), and the
selection that drops what the window holds and what another candidate says already."""

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from app.core.config import RecallSettings
from app.core.context import AppContext
from app.recall.cross_encoder import HttpReranker, RerankUnavailable
from app.recall.fusion import ArmWeights, FusedCandidate, fuse_arms
from app.recall.hits import MEMORY_PREFIX
from app.recall.query import embedding_query
from app.recall.rerank import (
    RerankCandidate,
    RerankFeatures,
    ScoredCandidate,
    Selection,
    cross_encoded,
    cross_encoder_asked,
    feature_rerank,
    select_within_budget,
)
from app.recall.rewrite import RewrittenQuery
from app.recall.session_chunks import SessionChunks
from app.recall.tool_results import ResultOfCall
from app.store import chunks as chunks_store
from app.store.models import Memory

logger = logging.getLogger("contextd.recall")


def normalised(scores: dict[str, float]) -> dict[str, float]:
    """Min-max to [0, 1] (all equal: 1.0), the relative fusion's scale, order kept."""
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    span = high - low
    return {d: (v - low) / span if span > 0 else 1.0 for d, v in scores.items()}


def fuse(
    settings: RecallSettings,
    exact: Sequence[str],
    lexical: Mapping[str, float],
    vector: Mapping[str, float],
) -> list[FusedCandidate]:
    """The arms fused as `settings` say: `lexical` ranked by its scores, `vector` in its order
    (best first)."""
    return fuse_arms(
        exact=exact,
        lexical=sorted(lexical, key=lambda d: -lexical[d]),
        vector=list(vector),
        k=settings.rrf_k,
        weights=ArmWeights(settings.weight_exact, settings.weight_lexical, settings.weight_vector),
        method=settings.fusion,
        lexical_scores=lexical,
        vector_scores=vector,
    )


def chunk_fields(chunk: chunks_store.ShownChunk) -> dict[str, Any]:
    """What a chunk is shown with (a recall hit's fields)."""
    return {
        "turn_first": chunk.turn_first,
        "turn_last": chunk.turn_last,
        "part": chunk.part,
        "parts": chunk.parts,
        "ts": chunk.ts_last,
        "text": chunk.raw_text,
        "trusted": chunk.trusted,
        "untrusted_roles": tuple(chunk.untrusted_roles),
        "text_tokens": chunk.token_count,
    }


def candidate_fields(
    fused: Sequence[FusedCandidate],
    memories: Mapping[str, Memory],
    chunks: Mapping[str, chunks_store.ShownChunk],
) -> dict[str, dict[str, Any]]:
    """What each fused candidate is shown with: a remembered item's, or an active chunk's
    (`chunks`: the rows read); a candidate with neither drops out."""
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
                "untrusted_roles": (),
                "part": 1,
                "parts": 1,
                "text_tokens": None,
            }
        elif f.id in chunks and chunks[f.id].status == "active":
            fields[f.id] = chunk_fields(chunks[f.id])
    return fields


def rerank_input(
    fused: Sequence[FusedCandidate],
    fields: Mapping[str, Mapping[str, Any]],
    answered: Mapping[str, ResultOfCall],
) -> list[RerankCandidate]:
    """The fused candidates that have fields, in fused order, as the rerank reads them (a
    result of a call with its call's text)."""
    return [
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


async def rerank(
    context: AppContext,
    query: RewrittenQuery,
    candidates: list[RerankCandidate],
    now_seq: int,
    fallbacks: list[str],
) -> list[ScoredCandidate]:
    """The HTTP cross-encoder when configured (its failure keeps the fused order and is flagged),
    else the deterministic features, their first candidates re-ordered with the in-process
    cross-encoder when it is on."""
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
    scored = feature_rerank(query, candidates, now_seq)
    if settings.cross_encoder == "off":
        return scored
    return await _cross_encoded(context, query, scored, fallbacks)


async def _cross_encoded(
    context: AppContext,
    query: RewrittenQuery,
    scored: list[ScoredCandidate],
    fallbacks: list[str],
) -> list[ScoredCandidate]:
    """`scored` with its first candidates re-ordered by the in-process cross-encoder too, when
    it may read them (`cross_encoder_asked`); unchanged, and flagged, when it cannot load."""
    leading = scored[: context.settings.recall.cross_encoder_candidates]
    if not cross_encoder_asked(query, leading):
        return scored
    model = await context.reranker.get()
    if model is None:
        fallbacks.append("cross_encoder_unavailable")
        return scored
    scores = await asyncio.to_thread(
        model.scores, embedding_query(query.raw, query), [s.candidate.text for s in leading]
    )
    return cross_encoded(scored, scores)


def select(
    scored: Sequence[ScoredCandidate],
    fields: Mapping[str, Mapping[str, Any]],
    rangeless: Collection[str],
    kept: SessionChunks,
    window_seqs: Collection[int],
) -> Selection:
    """Every reranked candidate but those the window holds and the duplicates
    (`select_within_budget`): the pieces of a split turn are one group, a piece holding one of
    the query's exact keys stays beside the others, `rangeless` ones (remembered items) have no
    turns, and the chunks' duplicate keys come from those this process keeps (`kept`)."""
    groups = {
        cid: f"turn:{fields[cid]['turn_first']}" for cid in fields if fields[cid]["parts"] > 1
    }
    return select_within_budget(
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
