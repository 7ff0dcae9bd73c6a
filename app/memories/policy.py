"""Pure rules of the remembered items: the text their vectors are made of, normalisation and
near-duplicates. No I/O."""

import re
import unicodedata
from collections.abc import Iterable, Sequence

from app.domain.text import term_set

# --- remember: near-duplicates ----------------------------------------------------------------

_PUNCT_RE = re.compile(r"[\W_]+", re.UNICODE)


def embedding_text(text: str, tags: Sequence[str]) -> str:
    """What the worker embeds for a remembered item: its text, then its tags in brackets
    ("Bart danced at the Christmas party. (Activity, Happy)"), so an item's labels (a topic, a
    mood) count in the vector arm too. Its lexical terms stay those of the text. MADial offline
    (scene and emotion as tags), e5, R@5 tune / check: en .651 / .546 -> .673 / .573, zh .648 /
    .567 -> .656 / .552."""
    return f"{text} ({', '.join(tags)})" if tags else text


def normalise(text: str) -> str:
    """Case-, width- and punctuation-insensitive form (NFKC folds full-width CJK punctuation)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return _PUNCT_RE.sub(" ", folded).strip()


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def near_duplicate(text: str, others: Iterable[tuple[str, str]], threshold: float) -> str | None:
    """The id of the first of `others` (id, text) that says the same as `text`, else None."""
    norm, terms_of = normalise(text), term_set(text)
    for other_id, other in others:
        if normalise(other) == norm or jaccard(terms_of, term_set(other)) >= threshold:
            return other_id
    return None


# --- recall: what counts as a match -------------------------------------------------------------
