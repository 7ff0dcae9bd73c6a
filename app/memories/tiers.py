"""The user's memory in tiers (pure, English and Chinese): which statements of a user turn are
profile facts or preferences to capture, the evidence an item gathers, the stability and tier
that evidence earns, the weight an item has in ranking, and which of two contradictory
statements prevails. No I/O.

Tiers, for a session that sees a user-scope item:
- `session`: the user said it in this session, and nowhere else yet;
- `candidate`: said (or written) once, in another session;
- `long_term`: promoted by evidence — said again in another session, restated over time
  (`promote_after_days` apart), seen in two contexts (said by the user and written down by the
  agent or the API), or confirmed by the user.
Captured items are trusted (the user's own words) and stated as facts at every tier; the tier
and its stability weigh them in ranking, and an item with no new evidence for `decay_days`
weighs less.
"""

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from app.domain.text import ascii_lower
from app.memories.conflicts import Statement, statement

# The slots about the user captured from what the user says (`app.memories.conflicts`). A
# budget or a deadline belongs to the task at hand (the notes keep it); an email or a phone
# number is stored only when the agent or the API writes it down on purpose.
PROFILE_SLOTS = ("name", "home", "employer", "allergy")
PREFERENCE_PREFIX = "preference:"

# Evidence kinds: the user said it in a turn; the agent (`remember`) or an API caller wrote it
# down; the user confirmed it (an API call speaking for the user).
SAID, WRITTEN, CONFIRMED = "said", "written", "confirmed"
CANDIDATE, LONG_TERM, SESSION = "candidate", "long_term", "session"

_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])|\n+")
_QUESTION_RE = re.compile(
    r"[?？]\s*$|[吗么][。.!！]?\s*$"
    r"|^(?:what|why|where|when|who|which|how|do|does|did|should|shall|would|could|can|is|are"
    r"|am|may|will)\b"
)
# Wishes, plans, conditions and guesses: "if I moved to Lyon", "we might move to Lyon",
# "我们打算搬到杭州", "如果我住在上海".
_NOT_A_FACT_RE = re.compile(
    r"\b(?:if|whether|suppose|imagine|might|maybe|perhaps|want to|wanna|plan to"
    r"|planning to|going to|hope to|wish|thinking of|thinking about|pretend|say that)\b"
    r"|如果|要是|假如|假设|打算|计划|准备|想要|想|可能|也许|或许|希望|将要|要搬|会搬"
)
# Someone else is the subject: "我朋友搬到了杭州", "他住在北京" (the English rules already want
# "I" or "we").
_OTHER_SUBJECT_RE = re.compile(
    r"(?:^|[，,：:\s])(?:他|她|他们|她们|用户|我的?(?:妈|爸|父母|朋友|哥|姐|弟|妹|老婆|老公"
    r"|丈夫|妻子|儿子|女儿|孩子|同事|老板|家人|室友))"
)


# "I'm allergic to peanuts and I prefer aisle seats", "我住在里昂，我对花生过敏": one clause each.
_CLAUSE_SPLIT_RE = re.compile(
    r",?\s+(?:and|but|also)\s+(?=(?:i|we|my|call me)\b)|[，；,;]\s*(?=我|叫我)", re.IGNORECASE
)


# What a statement about the user always holds: a sentence without it is not read further.
_FIRST_PERSON_RE = re.compile(r"\b(?:i|we|me|my|our)\b|\bi'm\b|我")


# A user turn whose metadata says `"remember": false` is off the record: never captured.
OFF_THE_RECORD_KEY = "remember"


def on_the_record(metadata: Mapping[str, Any] | None) -> bool:
    return (metadata or {}).get(OFF_THE_RECORD_KEY) is not False


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_SPLIT_RE.split(text) if s and s.strip()]


def _captured_slot(found: Statement) -> bool:
    return found.slot in PROFILE_SLOTS or found.slot.startswith(PREFERENCE_PREFIX)


def profile_statements(text: str) -> list[tuple[str, Statement]]:
    """The sentences of a user turn that state a profile fact or a preference of the user's
    ("I live in Paris", "we moved to Lyon", "I'm allergic to peanuts", "I prefer aisle seats",
    "call me Sam", "我住在巴黎", "我们搬到了里昂", "我对花生过敏", "我喜欢靠窗的座位", "叫我小王"),
    each (the clause that says it) with what it says; questions, wishes, conditions and other
    people's facts are left out. The last statement of a slot wins ("I prefer aisle seats.
    Actually, I prefer window seats.")."""
    found: dict[str, tuple[str, Statement]] = {}
    for sentence in sentences(text):
        low = ascii_lower(sentence).strip()
        if not _FIRST_PERSON_RE.search(low):
            continue
        if _QUESTION_RE.search(low) or _NOT_A_FACT_RE.search(low):
            continue
        for clause in _CLAUSE_SPLIT_RE.split(sentence):
            said = statement(clause)
            if said is None or not _captured_slot(said) or _OTHER_SUBJECT_RE.search(clause):
                continue
            key = said.slot if said.exclusive else f"{said.slot}={said.value}"
            found.pop(key, None)  # a later statement of the slot replaces it, in its place
            found[key] = (clause.strip(" ,，;；"), said)
    return list(found.values())


def same_statement(a: str, b: str) -> bool:
    """Whether two texts state the same thing ("I live in Lyon", "we moved to Lyon"): the same
    slot and value, held alike."""
    first, second = statement(a), statement(b)
    return first is not None and first == second


# --- evidence, stability, tier -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Evidence:
    """One time an item was seen: how (`SAID`, `WRITTEN`, `CONFIRMED`), in which session (its
    primary key), in which turns, and when (the turn's time, or the write's)."""

    kind: str
    session: str
    at: datetime
    seqs: tuple[int, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "session": self.session,
            "at": self.at.isoformat(),
            "seqs": list(self.seqs),
        }

    @classmethod
    def of_json(cls, data: Mapping[str, Any]) -> "Evidence":
        return cls(
            kind=str(data["kind"]),
            session=str(data["session"]),
            at=datetime.fromisoformat(str(data["at"])),
            seqs=tuple(int(s) for s in data.get("seqs", ())),
        )


# Evidence kept per item: a fact the user repeats in every session must not grow its row
# without end. What stability reads survives compaction (sessions, span, kinds).
EVIDENCE_KEPT = 32


def compacted(evidence: Sequence[Evidence]) -> list[Evidence]:
    """`evidence` (oldest first) with, per kind and session, only the first and the last
    sighting; past `EVIDENCE_KEPT`, the first of each kind and the newest others."""
    firsts: dict[tuple[str, str], Evidence] = {}
    lasts: dict[tuple[str, str], Evidence] = {}
    for e in evidence:
        firsts.setdefault((e.kind, e.session), e)
        lasts[(e.kind, e.session)] = e
    kept = [e for e in evidence if e in firsts.values() or e in lasts.values()]
    if len(kept) <= EVIDENCE_KEPT:
        return kept
    first_of_kind = {e.kind: e for e in reversed(kept)}.values()
    newest = [e for e in kept if e not in first_of_kind][-(EVIDENCE_KEPT - len(first_of_kind)) :]
    return [e for e in kept if e in first_of_kind or e in newest]


def without_sightings(
    evidence: Sequence[Evidence], session: str, seqs: Collection[int]
) -> list[Evidence]:
    """`evidence` without what was seen in `session`'s turns `seqs` (they were forgotten or
    marked untrusted: they no longer vouch for the item)."""
    return [e for e in evidence if e.session != session or not any(s in seqs for s in e.seqs)]


@dataclass(frozen=True, slots=True)
class Stability:
    """How settled an item is: a score of 0.25 (seen once) to 1.0, and the evidence that earns
    it beyond the first sighting: `sessions` (said again in another session), `time` (seen
    again `promote_after_days` or more later), `contexts` (said by the user and written down by
    the agent or the API), `confirmed` (by the user; it counts twice)."""

    score: float
    reasons: tuple[str, ...]

    @property
    def tier(self) -> str:
        return LONG_TERM if self.reasons else CANDIDATE


def stability(evidence: Sequence[Evidence], promote_after: timedelta) -> Stability:
    reasons: list[str] = []
    if len({e.session for e in evidence}) >= 2:
        reasons.append("sessions")
    moments = [e.at for e in evidence]
    if moments and max(moments) - min(moments) >= promote_after:
        reasons.append("time")
    kinds = {e.kind for e in evidence}
    if {SAID, WRITTEN} <= kinds:
        reasons.append("contexts")
    if CONFIRMED in kinds:
        reasons.append("confirmed")
    earned = len(reasons) + (1 if CONFIRMED in kinds else 0)
    return Stability(min(1.0, 0.25 * (1 + earned)), tuple(reasons))


def shown_tier(stored_tier: str | None, evidence: Sequence[Evidence], session: str) -> str | None:
    """The tier a session sees: `session` while every sighting is this session's own and it
    earned no promotion; else the stored one (None: an item with no tier, session scope)."""
    if stored_tier == CANDIDATE and evidence and all(e.session == session for e in evidence):
        return SESSION
    return stored_tier


def last_seen(evidence: Sequence[Evidence], written_at: datetime) -> datetime:
    return max((e.at for e in evidence), default=written_at)


def ranking_weight(
    score: float, last_evidence: datetime, now: datetime, decay: timedelta, stale_weight: float
) -> float:
    """What a user-scope item's relevance is multiplied by in the "about this user" block: 0.85
    for an item seen once up to 1.0 for a settled one, times `stale_weight` once it has had no
    new evidence for `decay` (a preference not heard of in 90 days may have changed)."""
    weight = 0.8 + 0.2 * score
    return weight * stale_weight if now - last_evidence > decay else weight


# --- precedence ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claim:
    """What precedence weighs of an item: whether its source is trusted (the user's words, an
    explicit `remember` or API write; not a tool result or an inference) and when it was said."""

    trusted: bool
    said_at: datetime


def prevails(new: Claim, old: Claim) -> bool:
    """Whether `new` replaces `old` about the same subject: an explicit statement beats an
    inference; between equals, the newer beats the older (a correction comes after what it
    corrects). A less trusted one never replaces a trusted one: both are shown, dated."""
    if new.trusted != old.trusted:
        return new.trusted
    return new.said_at >= old.said_at


def disputed_fact(text: str, said: datetime) -> str:
    """A fact an unconfirmed item contradicts, as the prompt shows it: dated, with the doubt."""
    return f"{text} (stated {said:%Y-%m-%d}; an unconfirmed item below says otherwise)"


def dispute(text: str, source: str, tool: str | None, said: datetime, fact: str) -> str:
    """The unconfirmed item itself: not current, where it came from, when, what it contradicts."""
    origin = f"{source} {tool}" if tool else source
    return (
        f"Unconfirmed, not current (from {origin}, {said:%Y-%m-%d}): {text} — it contradicts "
        f"{fact!r}; ask the user before relying on either"
    )
