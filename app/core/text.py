"""Language-neutral text normalisation for chunking, lexical indexing and recall.

Chinese (and other CJK scripts) have no spaces, so a run of CJK characters is indexed as its
characters (unigrams) plus overlapping character bigrams; everything else is split into lower-cased
word tokens. The same function feeds the Postgres `tsvector` and the in-process BM25, so both arms
see identical terms.
"""

import re
from collections.abc import Sequence
from functools import lru_cache

_CJK_CLASS = (
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf"  # CJK Extension A
    "\u4e00-\u9fff"  # CJK Unified Ideographs
    "\uf900-\ufaff"  # CJK Compatibility Ideographs
    "\uac00-\ud7af"  # Hangul syllables
)
_WORD = rf"[^\W_{_CJK_CLASS}]+"  # letters/digits, but not CJK (they form their own runs)
# A token is a run of CJK characters (group 1) or a word (group 2), joined across -_.@.
_TOKEN_RE = re.compile(rf"([{_CJK_CLASS}]+)|({_WORD}(?:[-_.@]{_WORD})*)", re.UNICODE)
_CJK_RUN_RE = re.compile(rf"^[{_CJK_CLASS}]+$")

# Common English function words. Negations and limit words ("no", "not", "only", "more", "before",
# ...) are deliberately absent: they carry the meaning of constraints.
ENGLISH_STOPWORDS = frozenset(
    """a about again against all am an and any are as at be because been being between both but by
    can could did do does doing down during each for from further had has have having he her here
    hers herself him himself his how i if in into is it its itself just me my myself now of off on
    once or other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up very was
    we were what when where which while who whom why will with would you your yours yourself
    yourselves""".split()
)


def is_cjk(text: str) -> bool:
    return bool(_CJK_RUN_RE.match(text))


def cjk_terms(run: str) -> list[str]:
    """Unigrams and overlapping bigrams of one run of CJK characters."""
    terms = list(run)
    terms.extend(run[i : i + 2] for i in range(len(run) - 1))
    return terms


SHORT_RUN = 8  # CJK runs up to this long (words, names) are common: their terms are cached


@lru_cache(maxsize=16384)
def _short_run_terms(run: str) -> tuple[str, ...]:
    return tuple(cjk_terms(run))


def terms(text: str, *, drop_stopwords: bool = True) -> list[str]:
    """Index/search terms of `text`: lower-cased words, CJK runs as unigrams + bigrams."""
    out: list[str] = []
    stopwords = ENGLISH_STOPWORDS if drop_stopwords else frozenset()
    for run, word in _TOKEN_RE.findall(text.lower()):  # one C pass; the group says which
        if run:
            out.extend(_short_run_terms(run) if len(run) <= SHORT_RUN else cjk_terms(run))
        elif word not in stopwords:
            out.append(word)
    return out


_PART_SEPARATOR_RE = re.compile(r"[-_.@]")


def lexical_document(text: str) -> str:
    """Space-joined terms for Postgres `to_tsvector('simple', ...)`, so it indexes our terms."""
    return terms_document(terms(text))


def terms_document(text_terms: Sequence[str]) -> str:
    """`lexical_document` of text whose `terms()` are already at hand.

    Punctuation inside identifiers (AB-12345, a.b@c.d) would be split by the 'simple' parser, so
    such terms are kept whole and also contribute their parts (CJK terms hold no separator).
    """
    out: list[str] = []
    for term in text_terms:
        out.append(term)
        if _PART_SEPARATOR_RE.search(term):
            out.extend(p for p in _PART_SEPARATOR_RE.split(term) if p)
    return " ".join(out)
