"""The relevance floor: whether recall's best match answers the query asked, or is only the
nearest thing a session holds to a question it knows nothing about.

Recall always has a nearest neighbour, and its fused and rerank scores are relative (each arm is
min-max normalised over the candidates, the rerank divides by the best fused score), so they rank
well but cannot tell "the answer" from "the least unrelated chunk". Two absolute signals can:

- lexical: the share of the query's own terms the item holds, each weighted by its IDF over the
  session's chunks (compared by stem; Chinese by character, held through the query's bigrams;
  question words such as 什么, 多少, "many" left out). A term the session never holds
  ("mercury", "kelvin", 沸点) weighs the most and is held by nothing: a question about
  something the conversation never mentioned scores low, whatever small talk shares its other
  words.
- familiar: the share of that weight on terms some chunk of the session holds, times
  `FAMILIAR_SHARE`: a question about what the conversation talks of, though no single item
  holds its words (LoCoMo's paraphrased questions), is not noise.
- vector: the item's cosine similarity to the query, above what unrelated texts reach with the
  e5 embedder and its query adapter (`VECTOR_ZERO`: the no-history set's questions reach .742
  against the travel chat), scaled so `VECTOR_ONE` counts as a full match. On LoCoMo the
  answering chunks sit in the same range (median .64), so it decides little there.

An item's relevance is the largest of the three (an ID or a number the session holds once weighs
the most, so an exact hit scores high lexically); recall is confident when one of its first
items reaches the floor (`CONTEXTD_RECALL__RELEVANCE_FLOOR`). The constants and the floor were
set on the LoCoMo tune split (conversations 0-3) and the tune half of the no-history set (its
questions at even positions); docs/BENCHMARKS.md, "Confident or silent".

Pure: no I/O, no settings.
"""

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.domain.dates import MONTHS
from app.domain.stem import stem
from app.domain.text import is_cjk, match_terms, terms
from app.recall.bm25 import idf
from app.recall.trim import line_stems

VECTOR_ZERO = 0.75
VECTOR_ONE = 0.85
# Words that ask rather than say what is asked about: no answer holds them (什么 of 我叫什么名字,
# 多少 of 多少钱, "many" of "how many").
QUESTION_WORDS_RE = re.compile(
    r"为什么|什么|怎么|怎样|多少|哪里|哪儿|哪个|哪些|哪|谁|吗|呢|\b(?:much|many)\b", re.IGNORECASE
)
# What a query whose words the session holds (anywhere) is worth to each item: at a floor of 0.3
# when 40 % of its weight is on words the session holds.
FAMILIAR_SHARE = 0.75
# The best of this many ranked items decides: an item ranked lower is not what recall quotes first.
CONFIDENT_WITHIN = 10


@dataclass(frozen=True, slots=True)
class QueryWeights:
    """What the query's terms weigh: `units` its words' stems and its CJK characters, each with
    its IDF; `pieces` the terms a text may hold, each with the units holding it covers."""

    units: dict[str, float]
    pieces: dict[str, tuple[str, ...]]
    # The share of the units' weight on units some chunk of the session holds: 0 for a question
    # about something the conversation never mentioned.
    familiar: float = 0.0


def query_weights(
    query: str, df: Callable[[str], int], n_docs: int, *, dated: bool = False
) -> QueryWeights:
    """The query's own terms as relevance counts them, weighted by IDF over the `n_docs` chunks
    (`df`: how many hold a term). A word counts by its stem. Chinese counts by character, each
    weighted by its own IDF (的 or 多 little, 沸 much), held when a text holds one of the
    query's bigrams with it: the bigrams across two words (的旅 of 京都的旅馆) are in no text,
    and weighting them would sink every Chinese question. A lone character counts only when
    the query has nothing longer.
    `dated`: the query names a day or month, which recall matches against each chunk's dates,
    not its text: the date's words (numbers, month names) do not count."""
    found = terms(QUESTION_WORDS_RE.sub(" ", query))
    wanted = match_terms(found)
    units: dict[str, float] = {}
    pieces: dict[str, tuple[str, ...]] = {}
    heard: dict[str, bool] = {}
    for term in found:
        if not is_cjk(term):
            if term in wanted and not (dated and (term.isdigit() or term in MONTHS)):
                key = stem(term)  # the session's index holds stems
                units[key] = idf(n_docs, df(key))
                heard[key] = df(key) > 0
                pieces[key] = (key,)
        elif len(term) > 1:
            pieces[term] = tuple(term)
        else:
            units[term] = idf(n_docs, df(term))
            heard[term] = df(term) > 0
            if term in wanted:
                pieces[term] = (term,)
    total = sum(units.values())
    held = sum(w for unit, w in units.items() if heard[unit])
    return QueryWeights(units, pieces, held / total if total > 0 else 0.0)


def lexical_relevance(weights: QueryWeights, text: str) -> float:
    """The IDF-weighted share of the query's units (`query_weights`) that `text` holds."""
    total = sum(weights.units.values())
    if total <= 0:
        return 0.0
    held = line_stems(text)
    covered = {unit for key, piece in weights.pieces.items() if key in held for unit in piece}
    return sum(w for unit, w in weights.units.items() if unit in covered) / total


def vector_relevance(similarity: float | None) -> float:
    """The cosine similarity above `VECTOR_ZERO`, scaled so that `VECTOR_ONE` is 1 (None: the
    vector arm did not return the item)."""
    if similarity is None:
        return 0.0
    return max(0.0, (similarity - VECTOR_ZERO) / (VECTOR_ONE - VECTOR_ZERO))


def relevance(weights: QueryWeights, text: str, similarity: float | None) -> float:
    """An item's relevance, 0-1: `lexical_relevance` or `vector_relevance`, the larger, rounded
    as the manifest shows it."""
    score = max(
        lexical_relevance(weights, text),
        FAMILIAR_SHARE * weights.familiar,
        vector_relevance(similarity),
    )
    return round(min(score, 1.0), 4)


def confident(relevances: Sequence[float], floor: float) -> bool:
    """Whether one of the first `CONFIDENT_WITHIN` items (in rank order) reaches `floor`."""
    return any(r >= floor for r in relevances[:CONFIDENT_WITHIN])
