"""What recall returns: its hits (`RecallHit`) and outcome (`RecallOutcome`), a hit as the prompt
and the memory tool render it (`recalled_item`), and the clock of its `timings_ms`. Pure: no I/O."""

import statistics
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from app.domain.records import RecalledItem
from app.recall.floor import CONFIDENT_WITHIN, RelevanceJudge, confident
from app.recall.fusion import FusedCandidate
from app.recall.rerank import RerankFeatures, ScoredCandidate, Selection
from app.recall.rewrite import RewrittenQuery

MEMORY_PREFIX = "memory:"


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
    # The hit's cosine similarity to the query (None: the vector arm did not return it): the
    # relevance floor reads it (`app.recall.floor`).
    vector_similarity: float | None = None
    # The hit cut down to the turns that answer the query (None: not cut).
    compact_text: str | None = None
    compact_seqs: tuple[int, ...] | None = None
    part: int = 1
    parts: int = 1
    text_tokens: int | None = None  # count_tokens(text), a chunk's stored count
    untrusted_roles: tuple[str, ...] = ()  # a chunk's: the roles of its untrusted turns


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
            untrusted_roles=hit.untrusted_roles,
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
    floor: float = 0.0  # the relevance the best hit must reach to be quoted (`app.recall.floor`)
    judge: RelevanceJudge | None = None  # None: the floor is off, nothing is judged

    def relevance(self, hit: RecallHit) -> float | None:
        """`hit`'s relevance to the caller's own words, 0-1 (`app.recall.floor`; None: not
        judged). A remembered item's similarity is on another scale (searched unadapted) and
        does not count."""
        if self.judge is None:
            return None
        similarity = hit.vector_similarity if hit.source == "chunk" else None
        return self.judge.of(hit.id, hit.text, similarity)

    def by_meaning(self, hit: RecallHit) -> float | None:
        """`hit`'s relevance by meaning (`floor.meaning_relevance`), when judged so: a question
        and an item sharing no word (across scripts, or what the user said in other words), so
        the memory tool's match gate reads it."""
        return None if self.judge is None else self.judge.by_meaning.get(hit.id)

    @property
    def confident(self) -> bool:
        """Whether one of the first hits reaches the floor (no hits: not confident). A remembered
        item counts as reaching it: the agent or the user chose to keep it, and it is searched
        on its own scale (a session of remembered items and no chunks has no term statistics;
        on MADial-Bench the floor silenced 98 % of the recalls that found the item)."""
        return confident(
            [
                1.0 if hit.source == "memory" else self.relevance(hit) or 0.0
                for hit in self.hits[:CONFIDENT_WITHIN]
            ],
            self.floor,
        )


class Clock:
    """The durations of one recall's stages in ms (`RecallOutcome.timings_ms`): each `lap` adds
    the time since the previous one to its stage."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round(self.timings.get(stage, 0.0) + (now - self._last) * 1000, 3)
        self._last = now


def arm_medians(vector: Mapping[str, float]) -> dict[bool, float]:
    """The median similarity of each vector arm's candidates, keyed by whether the arm is the
    remembered items'. Each arm has its own scale: the chunks are searched with the query
    adapter's vector, the remembered items with the query's own, whose cosines run about .2
    higher (e5, a travel chat: .75-.82 for a remembered item, .52-.58 for the chunks, whatever
    the question), so a remembered item measured from the chunks' median stood out for any
    question, and the memory tool quoted it as a match for "When does my passport expire?"."""
    sides: dict[bool, list[float]] = {False: [], True: []}
    for hit_id, similarity in vector.items():
        sides[hit_id.startswith(MEMORY_PREFIX)].append(similarity)
    return {side: statistics.median(sims) for side, sims in sides.items() if sims}


def hits_of(
    selection: Selection,
    fields: Mapping[str, Mapping[str, Any]],
    fused: Mapping[str, FusedCandidate],
    rangeless: Collection[str],
    vector: Mapping[str, float],
) -> tuple[list[RecallHit], list[tuple[RecallHit, str]]]:
    """The selected and the dropped candidates (with why) as hits: `fields` what each is shown
    with, `fused` its fused candidate by id, `rangeless` the remembered items, `vector` the
    vector arms' similarities; each hit's `vector_margin` is measured from the median of its
    own arm's (`arm_medians`)."""
    medians = arm_medians(vector)

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
            fused=fused[item.id],
            features=item.features,
            vector_margin=(
                round(vector[item.id] - medians[item.id.startswith(MEMORY_PREFIX)], 6)
                if item.id in vector
                else None
            ),
            vector_similarity=round(vector[item.id], 6) if item.id in vector else None,
            part=f["part"],
            parts=f["parts"],
            text_tokens=f["text_tokens"],
            untrusted_roles=f["untrusted_roles"],
        )

    return [hit(s) for s in selection.selected], [
        (hit(s), reason) for s, reason in selection.dropped
    ]
