"""The second hop: what a multi-hop question's first results name that the question does not,
to search again with ("Where did Caroline go after the support group?": the first hop finds the
support group turn, which names the city and the day; the second searches with them).

Names are capitalised words not opening a sentence, and numbers (years, days); Chinese has no
capitals, so its terms of two characters count when the session holds them rarely. A term most
chunks hold (a speaker's name in every turn) tells nothing apart: only terms at most
`MAX_DF_SHARE` of the session's chunks hold count, rarest first, at most `HOP_TERMS`.

Pure: no I/O, no settings. Measured and not kept (docs/BENCHMARKS.md, "A second hop"): it lives
here, beside the benchmark that measures it, not in the service.
"""

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from app.domain.text import is_cjk, terms

HOP_TERMS = 4
MAX_DF_SHARE = 0.05
HOP_SOURCES = 3  # the first hop's best results read

T = TypeVar("T")

_NAME_RE = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][a-z]{2,}|\d{2,4})\b", re.MULTILINE)


def hop_terms(
    query: str,
    texts: Sequence[str],
    df: Callable[[str], int],
    n_docs: int,
    *,
    limit: int = HOP_TERMS,
) -> list[str]:
    """The names, numbers and rare Chinese terms of the first `HOP_SOURCES` of `texts` (the
    first hop's results, best first) that the query does not hold, rarest in the session first
    (`df`: how many of its `n_docs` chunks hold a term)."""
    asked = set(terms(query))
    found: dict[str, int] = {}
    for text in texts[:HOP_SOURCES]:
        candidates = [m.lower() for m in _NAME_RE.findall(text)]
        candidates += [t for t in terms(text) if is_cjk(t) and len(t) == 2]
        for term in candidates:
            if term in asked or term in found:
                continue
            held = df(term)
            if 0 < held <= max(1.0, MAX_DF_SHARE * n_docs):
                found[term] = held
    return sorted(found, key=lambda t: (found[t], t))[:limit]


def merged_hops(first: Sequence[T], second: Sequence[T], key: Callable[[T], str]) -> list[T]:
    """The two hops' results as one ranking: the first hop's best `HOP_SOURCES` (what the second
    searched from), then the two alternating, each result once (by `key`)."""
    out: list[T] = list(first[:HOP_SOURCES])
    seen = {key(item) for item in out}
    rest = [iter(second), iter(first[HOP_SOURCES:])]
    while rest:
        for source in list(rest):
            item = next(source, None)
            if item is None:
                rest.remove(source)
            elif key(item) not in seen:
                seen.add(key(item))
                out.append(item)
    return out
