"""Pure rules of the remembered items: the trust their source earns, the lifecycle's moves, the
text their vectors are made of, normalisation and near-duplicates. No I/O."""

import re
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from app.domain.text import term_set

# --- provenance and the lifecycle -----------------------------------------------------------

# Where an item's text came from. The user's own words, the agent's explicit `remember` and an
# API caller's statement are trusted; what a tool returned, what a model inferred or summed up
# and text retrieved from elsewhere are not, until someone verifies them.
TRUSTED_SOURCES = ("remember", "api", "user_turn")
UNTRUSTED_SOURCES = ("assistant_turn", "tool_result", "notes_rule", "inference", "retrieved")
SOURCES = (*TRUSTED_SOURCES, *UNTRUSTED_SOURCES)

# The moves a caller may ask for, and the statuses each may start from. Verifying confirms an
# unconfirmed item; quarantining takes any live item out of the prompt until it is verified.
STATUS_MOVES: dict[str, tuple[str, ...]] = {
    "verified": ("candidate", "quarantined"),
    "quarantined": ("candidate", "verified", "active"),
}


def trusted_source(source: str) -> bool:
    return source in TRUSTED_SOURCES


def initial_status(source: str) -> str:
    """A trusted item is stated as a fact at once; any other waits as a candidate."""
    return "active" if trusted_source(source) else "candidate"


def refused_move(current: str, wanted: str) -> str | None:
    """Why the item cannot move from `current` to `wanted`, or None when it can."""
    allowed = STATUS_MOVES.get(wanted)
    if allowed is None:
        return f"status can be set to {' or '.join(sorted(STATUS_MOVES))}, not {wanted!r}"
    if current not in allowed:
        return f"a {current} item cannot become {wanted} (only a {' or '.join(allowed)} one)"
    return None


def expiry(now: datetime, ttl_seconds: int | None) -> datetime | None:
    return now + timedelta(seconds=ttl_seconds) if ttl_seconds is not None else None


def validity_error(valid_from: datetime | None, valid_until: datetime | None) -> str | None:
    if valid_from is not None and valid_until is not None and valid_until <= valid_from:
        return "valid_until must be later than valid_from"
    return None


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


def shares_terms(query: str, text: str) -> bool:
    """Whether an unconfirmed item answers an explicit recall: it holds a term of the query
    (English words or Chinese characters alike, `app.domain.text.term_set`)."""
    wanted = term_set(query)
    return bool(wanted) and not wanted.isdisjoint(term_set(text))
