"""Evidence per token: cut a recalled chunk down to the turns that answer the query, verbatim.

A ~100-token chunk with its header costs what three or four single turns cost, while the
evidence a question needs is usually one or two of its turns. `trim_chunk` keeps the turns whose
query terms weigh most (each term counted once a turn, weighted by the query weight times its
idf in the session's history), the turn answering a kept question, and marks every gap with
`ELISION`; the chunk id in the item's header keeps the whole chunk one `memory recall` away.
A chunk where no turn shares a term with the query (found by meaning alone) is kept whole.

Pure: no I/O, no settings.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from app.domain.stem import stem
from app.domain.text import terms

ELISION = "…"
KEEP_RATIO = 0.5  # a turn is kept when its score reaches this share of the chunk's best turn
MAX_KEPT_TURNS = 3


@dataclass(frozen=True, slots=True)
class TrimmedChunk:
    text: str
    seqs: tuple[int, ...]  # the turns shown, in order
    trimmed: bool  # False: the chunk is shown whole


@lru_cache(maxsize=8192)
def line_stems(text: str) -> frozenset[str]:
    """The stems of `text`'s terms (a shown chunk's turns recur from build to build)."""
    return frozenset(stem(t) for t in terms(text))


def turn_score(text: str, query_weights: Mapping[str, float], idf: Callable[[str], float]) -> float:
    """Σ over the query's terms found in `text` (each once, compared by stem: `query_weights` are
    keyed by stems, `app.domain.stem`) of query weight × idf."""
    found = line_stems(text) & query_weights.keys()
    return sum(query_weights[t] * idf(t) for t in found)


def trim_chunk(
    lines: Sequence[tuple[int, str]],
    query_weights: Mapping[str, float],
    idf: Callable[[str], float],
    *,
    keep_ratio: float = KEEP_RATIO,
    max_kept: int = MAX_KEPT_TURNS,
) -> TrimmedChunk:
    """`lines` are the chunk's turns as (seq, rendered line), in order."""
    whole = TrimmedChunk("\n".join(text for _, text in lines), tuple(s for s, _ in lines), False)
    if len(lines) < 2:
        return whole
    scores = [turn_score(text, query_weights, idf) for _, text in lines]
    best = max(scores)
    if best <= 0:
        return whole
    ranked = sorted(range(len(lines)), key=lambda i: (-scores[i], i))
    kept = {i for i in ranked[:max_kept] if scores[i] >= keep_ratio * best}
    # A kept question is answered by the next turn, which may not repeat its words.
    for i in sorted(kept):
        if lines[i][1].rstrip().endswith(("?", "？")) and i + 1 < len(lines):
            kept.add(i + 1)
    if len(kept) == len(lines):
        return whole
    parts: list[str] = []
    previous = -1
    for i in sorted(kept):
        if i != previous + 1:
            parts.append(ELISION)
        parts.append(lines[i][1])
        previous = i
    if previous != len(lines) - 1:
        parts.append(ELISION)
    return TrimmedChunk("\n".join(parts), tuple(lines[i][0] for i in sorted(kept)), True)
