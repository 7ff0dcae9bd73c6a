"""Whether a text was lifted from another (pure): a `remember` whose text repeats a tool result
carries that result's word, and its orders if it gave any.

Texts are compared as their lexical terms (`app.domain.text.terms`, stopwords kept: words, and
the characters and character pairs of Chinese), so "The user approved a refund of $500" is found
in `{"note": "user approved refund of $500"}` and "车次G1234从北京南站出发" in
`{"车次": "G1234", "出发": "北京南站"}` alike.
"""

from collections.abc import Sequence

from app.domain.text import terms

# The share of the text's terms a source must hold: a statement of one's own that names what a
# result named keeps its names and numbers, rarely 70 % of its words; a copy keeps most.
LIFTED_SHARE = 0.7
# Below this many terms a text is a name or an ID: one source or another holds it by chance as
# much as by copying.
MIN_TERMS = 5


def lifted_from(text: str, sources: Sequence[str]) -> int | None:
    """The index of the source holding most of `text`'s terms (at least `LIFTED_SHARE`), the
    latest on a tie; None when none does or `text` is too short to tell."""
    wanted = set(terms(text, drop_stopwords=False))
    if len(wanted) < MIN_TERMS:
        return None
    best, best_share = None, LIFTED_SHARE
    for i, source in enumerate(sources):
        share = len(wanted.intersection(terms(source, drop_stopwords=False))) / len(wanted)
        if share >= best_share:
            best, best_share = i, share
    return best
