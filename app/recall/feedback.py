"""Second retrieval hop: pseudo-relevance feedback from the first hop's best hits.

A multi-hop question ("What LGBTQ+ events has Caroline taken part in?") names its subject but
rarely the words of each piece of evidence; the first hits do: they say "pride parade", "support
group", "Sweden". `feedback_terms` takes the distinctive terms of the first hop's best
`FEEDBACK_DOCS` chunks and the service runs them, next to the query's own terms, as a second
BM25 query over the session's index; its hits are fused with the first hop as one more arm, so
chunks the first hop missed get in.

A term of a feedback chunk scores Σ over the chunks holding it of (its share of that chunk's
terms) × (1 / the chunk's rank) × idf, times `NAME_BOOST` when it is written capitalised inside
a sentence (a name: a person, a place, a title). Left out: the query's own terms (already
searched), terms only one chunk of the session holds (a second query for them finds nothing
new), terms more than `MAX_DF_SHARE` of the chunks hold (speaker names, small talk; a term of
two chunks always qualifies, also in a session of a few chunks), digits-only
terms and terms of under three letters. The best `FEEDBACK_TERMS` terms get weights up to
`FEEDBACK_TERM_WEIGHT` (the query's own terms weigh 1), proportional to their score.

Pure: no I/O, no settings.
"""

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from app.core.text import terms
from app.recall.bm25 import BM25Index, idf
from app.recall.stem import by_stem, stem

FEEDBACK_DOCS = 5
FEEDBACK_TERMS = 15
FEEDBACK_TERM_WEIGHT = 0.5
NAME_BOOST = 1.5
MAX_DF_SHARE = 0.2
MIN_TERM_CHARS = 3

# A capitalised word after a space (so not the first word of the text or of a line).
_CAPITALISED_RE = re.compile(r"(?<= )[A-Z][a-z]+\b")
_SENTENCE_END = ".!?:\n"  # a colon ends a speaker label ("Caroline: Wow, ...")


def name_stems(text: str) -> set[str]:
    """Stems of the words `text` writes capitalised inside a sentence (not after ".!?:")."""
    out: set[str] = set()
    for match in _CAPITALISED_RE.finditer(text):
        i = match.start() - 1
        while i >= 0 and text[i] == " ":
            i -= 1
        if i >= 0 and text[i] not in _SENTENCE_END:
            out.add(stem(match.group(0).lower()))
    return out


def feedback_terms(
    texts: Sequence[str],
    query_stems: Mapping[str, float],
    df: Callable[[str], int],
    n_docs: int,
    idf: Callable[[str], float],
    *,
    max_terms: int = FEEDBACK_TERMS,
    term_weight: float = FEEDBACK_TERM_WEIGHT,
    name_boost: float = NAME_BOOST,
    max_df_share: float = MAX_DF_SHARE,
) -> dict[str, float]:
    """Feedback terms (stems, as the session's BM25 index keys them) of `texts`, the first hop's
    best hits in rank order, with their query weights; {} when none qualifies."""
    scores: dict[str, float] = {}
    for rank, text in enumerate(texts, start=1):
        counts = by_stem(Counter(terms(text)))
        length = sum(counts.values())
        if not length:
            continue
        names = name_stems(text)
        for term, count in counts.items():
            if (
                term in query_stems
                or len(term) < MIN_TERM_CHARS
                or term.isdigit()
                or not 1 < df(term) <= max(2.0, max_df_share * n_docs)
            ):
                continue
            boost = name_boost if term in names else 1.0
            scores[term] = scores.get(term, 0.0) + count / length / rank * idf(term) * boost
    best = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:max_terms]
    if not best:
        return {}
    top = best[0][1]
    return {term: term_weight * score / top for term, score in best}


def second_hop_query(
    query_stems: Mapping[str, float], feedback: Mapping[str, float]
) -> dict[str, float]:
    """The second hop's BM25 query: the query's own terms and the feedback terms."""
    return {**feedback, **query_stems}


def second_hop(
    index: BM25Index,
    query_stems: Mapping[str, float],
    first_hits: Sequence[str],
    limit: int,
    *,
    docs: int = FEEDBACK_DOCS,
) -> dict[str, float]:
    """BM25 scores of the best `limit` chunks of `index` for the query's own terms and the
    feedback terms of the first `docs` of `first_hits` (texts, the first hop's order), best
    first; {} when no feedback term qualifies (the second hop would repeat the first)."""
    n_docs = len(index)
    feedback = feedback_terms(
        first_hits[:docs], query_stems, index.df, n_docs, lambda t: idf(n_docs, index.df(t))
    )
    if not feedback:
        return {}
    return dict(index.score(second_hop_query(query_stems, feedback), top_n=limit))
