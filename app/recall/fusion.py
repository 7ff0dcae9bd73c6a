"""Fusion of the recall arms (exact, lexical, vector): relative score fusion (the default,
`CONTEXTD_RECALL__FUSION=relative`) or weighted reciprocal rank fusion.

Relative score fusion min-max normalises each arm's scores to [0, 1] and sums them with the
weights. It keeps how far ahead a candidate is in an arm (a BM25 score three times the
runner-up's), which rank fusion throws away; on LoCoMo it recalled more at every budget
(docs/BENCHMARKS.md, "Recall quality").

RRF scores a candidate by Σ wᵢ / (k + rankᵢ) over the lists it appears in (rank 1-based). It needs
no score calibration between arms (BM25 scores and cosine similarities are not comparable).

Default weights, and why:
- lexical 1.0, vector 1.0: bm25 + e5 fused at equal weight with k = 60 was the best measured
  combination (shared/eval/README.md). A weaker embedder (the `use` model) fused at equal weight
  *lowered* recall there, so callers with a weak embedder should pass a vector weight below 1.
- exact 3.0: an exact ID/quoted-string hit is the strongest evidence there is ("exact hits
  first"). With 3.0, an exact hit anywhere in the top 30 (3/90 = 0.0333) outranks a candidate that
  is first in both other arms but not an exact hit (2/61 = 0.0328).

Pure: no I/O, no settings.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

FusionMethod = Literal["rrf", "relative"]

RRF_K = 60
EXACT_WEIGHT = 3.0
LEXICAL_WEIGHT = 1.0
VECTOR_WEIGHT = 1.0


def rrf(
    ranked_lists: Sequence[Sequence[str]],
    k: int = RRF_K,
    weights: Sequence[float] | None = None,
) -> list[tuple[str, float]]:
    """Fuse ranked id lists into (id, score), best first.

    A repeated id inside one list counts at its first (best) rank only. Ties are broken by the
    best rank the id reached in any list, then by first appearance (list order, then position).
    """
    if k < 0:
        raise ValueError(f"rrf k must be >= 0, got {k}")
    if weights is None:
        weights = [1.0] * len(ranked_lists)
    if len(weights) != len(ranked_lists):
        raise ValueError(f"{len(weights)} weights for {len(ranked_lists)} ranked lists")
    if any(w < 0 for w in weights):
        raise ValueError("rrf weights must be >= 0")
    scores: dict[str, float] = {}
    best_rank: dict[str, int] = {}
    for ranked, weight in zip(ranked_lists, weights, strict=True):
        seen: set[str] = set()
        for rank, doc_id in enumerate(ranked, start=1):
            if doc_id in seen:
                continue
            seen.add(doc_id)
            scores[doc_id] = scores.get(doc_id, 0.0) + weight / (k + rank)
            best_rank[doc_id] = min(best_rank.get(doc_id, rank), rank)
    first_seen = {doc_id: i for i, doc_id in enumerate(scores)}
    ordered = sorted(scores, key=lambda d: (-scores[d], best_rank[d], first_seen[d]))
    return [(doc_id, scores[doc_id]) for doc_id in ordered]


@dataclass(frozen=True, slots=True)
class ArmWeights:
    exact: float = EXACT_WEIGHT
    lexical: float = LEXICAL_WEIGHT
    vector: float = VECTOR_WEIGHT


@dataclass(frozen=True, slots=True)
class FusedCandidate:
    """One fused candidate with the 1-based rank it had in each arm (None: not returned by it)."""

    id: str
    score: float
    rank: int
    exact_rank: int | None = None
    lexical_rank: int | None = None
    vector_rank: int | None = None

    @property
    def arms(self) -> list[str]:
        named = (
            ("exact", self.exact_rank),
            ("lexical", self.lexical_rank),
            ("vector", self.vector_rank),
        )
        return [name for name, rank in named if rank is not None]


def _ranks(ranked: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for rank, doc_id in enumerate(ranked, start=1):
        out.setdefault(doc_id, rank)
    return out


def relative_score_fusion(
    scored_lists: Sequence[Mapping[str, float]], weights: Sequence[float]
) -> list[tuple[str, float]]:
    """Σ wᵢ · minmax(scoreᵢ) over the lists an id appears in, best first (ties: first seen).

    A list whose scores are all equal normalises to 1.0 for each of its ids."""
    if len(weights) != len(scored_lists):
        raise ValueError(f"{len(weights)} weights for {len(scored_lists)} scored lists")
    totals: dict[str, float] = {}
    for scores, weight in zip(scored_lists, weights, strict=True):
        if not scores:
            continue
        low, high = min(scores.values()), max(scores.values())
        span = high - low
        for doc_id, score in scores.items():
            normalised = (score - low) / span if span > 0 else 1.0
            totals[doc_id] = totals.get(doc_id, 0.0) + weight * normalised
    first_seen = {doc_id: i for i, doc_id in enumerate(totals)}
    ordered = sorted(totals, key=lambda d: (-totals[d], first_seen[d]))
    return [(doc_id, totals[doc_id]) for doc_id in ordered]


def fuse_arms(
    *,
    exact: Sequence[str] = (),
    lexical: Sequence[str] = (),
    vector: Sequence[str] = (),
    k: int = RRF_K,
    weights: ArmWeights | None = None,
    method: FusionMethod,
    lexical_scores: Mapping[str, float] | None = None,
    vector_scores: Mapping[str, float] | None = None,
) -> list[FusedCandidate]:
    """Fuse the three arms; an arm that is down (e.g. vector_unavailable) is passed empty.

    `method="relative"` needs the arms' scores (BM25 scores, cosine similarities); exact hits
    count as a full score of 1 each."""
    w = weights or ArmWeights()
    if method == "relative":
        fused = relative_score_fusion(
            [
                dict.fromkeys(exact, 1.0),
                {d: (lexical_scores or {})[d] for d in lexical},
                {d: (vector_scores or {})[d] for d in vector},
            ],
            [w.exact, w.lexical, w.vector],
        )
    else:
        fused = rrf([exact, lexical, vector], k=k, weights=[w.exact, w.lexical, w.vector])
    exact_r, lexical_r, vector_r = _ranks(exact), _ranks(lexical), _ranks(vector)
    return [
        FusedCandidate(
            id=doc_id,
            score=score,
            rank=rank,
            exact_rank=exact_r.get(doc_id),
            lexical_rank=lexical_r.get(doc_id),
            vector_rank=vector_r.get(doc_id),
        )
        for rank, (doc_id, score) in enumerate(fused, start=1)
    ]
