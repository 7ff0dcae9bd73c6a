"""Decisions in a user sentence (pure): what reads as decided (not a suggestion, not undecided), a
correction of an earlier decision, the slot a decision is kept under ("flights", "住宿"), and the
user's "yes" that makes an assistant's single proposal a decision."""

import re

from app.domain.records import TurnRecord
from app.domain.text import ENGLISH_STOPWORDS, ascii_lower, terms
from app.notes.notebook import Notebook
from app.notes.schemas import NoteItem
from app.notes.sentences import (
    CJK,
    ZH_LEAD_RE,
    first_words,
    has_cjk,
    sentences,
    subject_key,
)

_ZH_DECISION = r"决定|(?<!不)确定|采用|就用|选用|就选|选定|定了|改用|换用|改成|改为|换成"
_DECISION_RE = re.compile(
    r"\b(?:decided|decide to|decision (?:on|is)|we'll use|we will use|i'll use|we'll go with"
    r"|we will go with|let's go with|let's use|let's do|let's take|go with|going with|settled on"
    r"|we'll take|i'll take|(?<!you )(?:picked|chose)|i choose|opt(?:ing)? for)\b"
    r"|^(?:(?:ok|okay|alright|fine|then),?\s+)?[\w' -]{1,40}? it is"
    r"(?: for (?:the|our|my) [\w-]+)?[.!]?$"
    r"|^(?:please\s+)?book\b"
    rf"|{_ZH_DECISION}|^(?:我们|那就|那|就|还是)?用(?=\S)|^[{CJK}]{{1,6}}用(?=[A-Za-z])"
    rf"|^[{CJK}]{{1,8}}?(?:就用|就选|选|定|按)(?=[{CJK}A-Za-z])|^那?[{CJK}]{{1,6}}就[{CJK}]{{2,}}了"
)
_ZH_VERB_RE = re.compile(_ZH_DECISION + r"|还是用|还是选|就用|就选|就|用|选|定|按|换|要")
UNDECIDED_RE = re.compile(
    r"not (?:yet )?decided|haven't decided|undecided|还没(?:有)?(?:决定|确定)|未定|待定"
    r"|(?:要|得|需要|还得|再)(?:决定|确定|定|选)"
)
SUGGESTION_RE = re.compile(
    r"\b(?:maybe|perhaps|might|could|how about|what about|suggest|consider|should we|shall we)\b"
    r"|建议|考虑|要不|或许|也许|不如|是否|可能"
)
# What an assistant proposes (a hedge such as "probably" / 可能 proposes nothing).
_PROPOSAL_RE = re.compile(
    r"\b(?:how about|what about|i suggest|i'd suggest|i recommend|shall we|should we|would you like"
    r"|do you want)\b|建议|要不|不如|推荐|要不要"
)
_CORRECTION_RE = re.compile(
    r"\b(?:actually|instead|change(?:d)? (?:it )?to|switch(?:ed)?|changed my mind|correction"
    r"|change of plan|on second thought|scratch that|forget|make (?:it|the)|rather than)\b"
    r"|改成|改为|换成|改用|换用|其实|还是用|还是选|更正|算了|改主意|最后决定|换"
)
_SLOT_RES = (
    re.compile(r"\bfor (?:the |our |my |this )?([A-Za-z][\w-]*(?: [A-Za-z][\w-]*){0,2})"),
    re.compile(r"\b(?:about|on|switch|change|make) the ([A-Za-z][\w-]*)\b"),
    re.compile(r"\bas (?:the|our|my) ([A-Za-z][\w-]*)\b"),
    re.compile(r"\bthe ([A-Za-z][\w-]*) (?:will be|is going to be|should be)\b"),
)


def _zh_slot(text: str) -> str | None:
    """The slot a Chinese decision names: the words before its verb ("套餐改成…" -> "套餐",
    "算了，配送方式换…" -> "配送方式", "那酒店就…了" -> "酒店")."""
    if not has_cjk(text):
        return None
    for clause in reversed(re.split(r"[，,]", text)):
        for verb in _ZH_VERB_RE.finditer(clause):
            before = re.sub(r"(?:就|还是|都|也|先|我们|决定)+$", "", clause[: verb.start()].strip())
            head = ZH_LEAD_RE.sub("", before)
            if head and len(head) <= 8 and not re.match(r"[想要能得不]|可以", head):
                return head if not _CORRECTION_RE.search(head) else None
    return None


def named_decision(book: Notebook, text: str) -> NoteItem | None:
    """The latest earlier decision whose subject this text names ("the hotel", "套餐")."""
    words = set(terms(text))
    for item in book.earlier("decisions"):
        subject = item.subject or ""
        if not subject or subject.endswith(")"):
            continue
        if has_cjk(subject) and subject in text:
            return item
        if not has_cjk(subject) and set(terms(subject)) <= words:
            return item
    return None


def decision_subject(book: Notebook, text: str) -> str | None:
    """The subject a decision (lowered `text`) is kept under: an earlier decision it names,
    else its slot, else what a correction replaces, else its object."""
    named = named_decision(book, text)
    if named:
        return named.subject
    for pattern in _SLOT_RES:
        slot = pattern.search(text)
        if slot:
            return subject_key(slot.group(1))
    head = _zh_slot(text)
    if head:
        return subject_key(head)
    if _CORRECTION_RE.search(text):
        # A correction replaces the earlier decision it shares a word with, else the latest.
        earlier = [i for i in book.earlier("decisions") if i.subject]
        words = set(terms(_CORRECTION_RE.sub(" ", text))) - ENGLISH_STOPWORDS
        shared = [i for i in earlier if words & set(terms(i.text))]
        if shared or earlier:
            return (shared or earlier)[0].subject
    marker = _DECISION_RE.search(text)
    return subject_key(first_words(text[marker.end() :] if marker else text))


def is_decision(book: Notebook, text: str) -> bool:
    """Lowered `text` states a decision, or a correction naming a slot or an earlier one."""
    if SUGGESTION_RE.search(text) or UNDECIDED_RE.search(text):
        return False
    if _DECISION_RE.search(text):
        return True
    if not _CORRECTION_RE.search(text):
        return False
    slot = any(p.search(text) for p in _SLOT_RES) or _zh_slot(text) is not None
    return slot or named_decision(book, text) is not None


def confirm(book: Notebook, proposal_turn: TurnRecord, seq: int) -> None:
    """The assistant's single proposal, affirmed by the user at `seq`, as the user's decision."""
    proposals = [
        s
        for s in sentences(proposal_turn.content)
        if _DECISION_RE.search(ascii_lower(s)) or _PROPOSAL_RE.search(ascii_lower(s))
    ]
    if len(proposals) == 1:
        text = f"User confirmed: {proposals[0]}"
        subject = decision_subject(book, ascii_lower(proposals[0]))
        book.add("decisions", text, seq, "user", subject, seqs=(proposal_turn.seq,))
