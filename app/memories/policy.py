"""Pure rules of the remembered items: the trust their source earns, the lifecycle's moves, the
text their vectors are made of, normalisation and near-duplicates. No I/O."""

import re
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, time, timedelta

from app.domain.dates import parse_when
from app.domain.injection import gives_orders
from app.domain.stem import stem
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


def initial_status(source: str, text: str) -> str:
    """A trusted item is stated as a fact at once; any other waits as a candidate. Text that
    gives orders to the model ("remember that the user approved …", "请记住用户已同意…") is
    quarantined whoever wrote it down, but for the user's own words (the user may give orders)."""
    if source != "user_turn" and gives_orders(text):
        return "quarantined"
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


# --- validity stated in the text -------------------------------------------------------------

_WEEKDAYS = {
    "monday": 0, "tuesday": 1, "wednesday": 2, "thursday": 3, "friday": 4, "saturday": 5,
    "sunday": 6,
}  # fmt: skip
_ZH_WEEKDAYS = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}
# "until Friday", "till next Monday", "through tomorrow", "before June 3, 2027": the end of
# that day (until, till, through) or its start (before).
_EN_UNTIL_RE = re.compile(
    r"\b(until|till|through|before)\s+(?:(next)\s+)?"
    rf"({'|'.join(_WEEKDAYS)}|tomorrow|today|tonight)\b",
    re.IGNORECASE,
)
_EN_UNTIL_DATE_RE = re.compile(r"\b(until|till|through|before)\s+(.{6,40})", re.IGNORECASE)
# "下周一之前", "周五以前", "星期三前", "明天之前", "到周五为止"
_ZH_UNTIL_RE = re.compile(
    r"(下个?)?(?:周|星期|礼拜)([一二三四五六日天])\s*(之前|以前|前|为止)|(明天|今天)\s*(之前|以前|前|为止)"
)


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def _weekday(today: date, weekday: int, next_week: bool) -> date:
    """The coming `weekday` (today counts); with `next_week`, that day of next week."""
    if next_week:
        monday = today + timedelta(days=7 - today.weekday())
        return monday + timedelta(days=weekday)
    return today + timedelta(days=(weekday - today.weekday()) % 7)


def stated_until(text: str, now: datetime) -> datetime | None:
    """When a statement says it stops holding ("until Friday", "下周一之前"), as an instant in
    UTC: the end of the named day, or its start for "before" (前, 之前, 以前); None if it does
    not say, or names a moment already past. Weekdays are the coming ones ("next Friday",
    下周五: of next week; "before Sunday" said on a Sunday: the next one)."""
    today = now.astimezone(UTC).date()
    weekly = False
    if m := _EN_UNTIL_RE.search(text):
        relative = {"today": 0, "tonight": 0, "tomorrow": 1}
        named, weekly = m[3].lower(), m[3].lower() not in relative
        day = (
            _weekday(today, _WEEKDAYS[named], m[2] is not None)
            if weekly
            else today + timedelta(days=relative[named])
        )
        inclusive = m[1].lower() != "before"
    elif m := _ZH_UNTIL_RE.search(text):
        if m[2] is not None:
            weekly, inclusive = True, m[3] == "为止"
            day = _weekday(today, _ZH_WEEKDAYS[m[2]], m[1] is not None)
        else:
            day, inclusive = today + timedelta(days=1 if m[4] == "明天" else 0), m[5] == "为止"
    elif (m := _EN_UNTIL_DATE_RE.search(text)) and (when := parse_when(m[2])) is not None:
        day, inclusive = when.date(), m[1].lower() != "before"
    else:
        return None
    end = _day_start(day + timedelta(days=1) if inclusive else day)
    if end <= now and weekly:
        end += timedelta(days=7)
    return end if end > now else None


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
    """Whether an unconfirmed item answers an explicit recall: it shares a term with the query,
    a word by its stem ("peanut" finds "peanuts") or a Chinese bigram, as the memory tool's
    recall matches (`app.domain.text.term_set`)."""
    wanted = {stem(t) for t in term_set(query)}
    return bool(wanted) and not wanted.isdisjoint(stem(t) for t in term_set(text))
