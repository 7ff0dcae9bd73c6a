"""A light English suffix stemmer for the lexical arm: "researching", "researched" and
"research" become one term, "adoptions" and "adoption" too.

Applied on both sides of BM25 (the index's stored term counts are merged under their stems when
the index is built; the query's terms are stemmed the same way), so the stored terms stay as
`app.domain.text.terms` makes them. Conservative on purpose: only inflections (plural -s/-es/-ies,
-ing, -ed, -ly), never derivations, and a stem keeps at least three letters; a word holding a
digit, a CJK term, or an identifier with punctuation is left alone.

Pure: no I/O, no settings.
"""

from collections.abc import Mapping
from functools import lru_cache
from typing import TypeVar

_VOWELS = frozenset("aeiouy")
_MIN_STEM = 3
# Doubled final consonants that an -ing/-ed suffix added ("running" -> "run").
_UNDOUBLE = frozenset("bdgmnprt")


def _has_vowel(text: str) -> bool:
    return any(c in _VOWELS for c in text)


def _undouble(stem: str) -> str:
    if len(stem) > _MIN_STEM and stem[-1] == stem[-2] and stem[-1] in _UNDOUBLE:
        return stem[:-1]
    return stem


@lru_cache(maxsize=65536)
def stem(term: str) -> str:
    """The stem of one lower-cased term (itself when no rule applies)."""
    if not term.isascii() or not term.isalpha() or len(term) <= _MIN_STEM:
        return term
    base = _strip_suffix(term)
    # A final silent e goes too, so "love", "loved" and "loving" meet.
    return base[:-1] if base.endswith("e") and len(base) > _MIN_STEM else base


def _strip_suffix(term: str) -> str:
    if term.endswith("ies") and len(term) > _MIN_STEM + 1:
        return term[:-3] + "y"
    if term.endswith(("sses", "shes", "ches", "xes", "zes")):
        return term[:-2]
    if term.endswith("s") and not term.endswith(("ss", "us", "is")):
        return term[:-1] if len(term) > _MIN_STEM else term
    if term.endswith("ing"):
        base = term[:-3]
        if len(base) >= _MIN_STEM and _has_vowel(base):
            return _undouble(base)
        return term
    if term.endswith("ied") and len(term) > _MIN_STEM + 1:
        return term[:-3] + "y"
    if term.endswith("ed") and not term.endswith("eed"):
        base = term[:-2]
        if len(base) >= _MIN_STEM and _has_vowel(base):
            return _undouble(base)
        return term
    if term.endswith("ly") and len(term) > _MIN_STEM + 3:
        return term[:-2]
    return term


Number = TypeVar("Number", int, float)


def by_stem(values: Mapping[str, Number]) -> dict[str, Number]:
    """Term weights or counts keyed by stem: terms sharing a stem add up."""
    out: dict[str, Number] = {}
    for term, value in values.items():
        key = stem(term)
        out[key] = out[key] + value if key in out else value
    return out
