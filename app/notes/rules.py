"""The default notes generator: deterministic, offline rules for English and Chinese.

Who may say what (seed 003 §5.6: never turn a suggestion into a decision, nor an assistant guess
into a user fact):
- user turns give goals, constraints, decisions, open/done items and facts;
- assistant turns give only open/done items (progress reports). An assistant proposal becomes a
  decision only when the very next user turn starts with an affirmation ("yes", "好的") and the
  assistant turn holds exactly one proposal; it is then recorded as the user's decision at the
  confirming turn. Assistant statements never become facts or constraints;
- tool turns give facts only, marked `trusted=False`; system turns give nothing (C0 is separate).

Texts are stored verbatim (sentence for goals/constraints/decisions/open/done, the clause around
each entity for facts), so hedges and limit words (可能, 不超过, 仅本次, at most) survive.

Subjects (the supersede key, see `policy.merge`):
- limit constraints: the head noun before the limit word plus the direction, "budget (max)",
  "预算 (max)"; with no noun, the unit after the number ("人 (max)");
- other constraints: the first words after the modal ("not fly skyline", "在地铁站附近");
- decisions: the explicit slot ("for the flights" -> "flights", "住宿就用…" -> "住宿"); else, for
  a correction (actually/instead/改成/换成…), the subject of the latest decision; else the object;
- facts: the label before the entity ("order number", "订单号"), else kind:value;
- retractions ("not X anymore", "no longer X", "不要X了", "不用X了", "X不要了", "取消X"): the
  subject and section of the latest earlier item whose text contains X, so the negation replaces
  it; unmatched, the sentence is kept as a constraint (a user negation) keyed on X.
"""

import json
import re
from collections.abc import Sequence
from typing import Any

from app.core.text import ENGLISH_STOPWORDS, terms
from app.domain.records import TurnRecord
from app.notes.policy import merge
from app.notes.schemas import SECTION_NAMES, NoteItem, Notes, SectionName, Source

_I, _CJK = re.IGNORECASE, "\u4e00-\u9fff"
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])|\n+")
_CLAUSE_SPLIT_RE = re.compile(r"[，；]|[,;](?=\s*[^\s\d])")
_GOAL_RE = re.compile(
    r"\b(?:i want|i'd like|i would like|i need|help me|my goal|our goal|the goal|i'm trying to)\b"
    r"|目标|我想|我要|帮我|请帮|希望|想要",
    _I,
)
_LIMIT_MAX = (
    r"\b(?:at most|no more than|not (?:to )?exceed|within|maximum|max"
    r"|(?:under|below|up to|less than|fewer than)(?= ?[$¥€£]?\d))\b"
    r"|不超过|不得超过|不能超过|最多|以内|之内|以下|不多于|不高于|上限"
)
_LIMIT_MIN = (
    r"\b(?:at least|no less than|minimum|(?:more than|over|above)(?= ?[$¥€£]?\d))\b"
    r"|至少|最少|不少于|不低于|以上|下限"
)
_LIMIT_RE = re.compile(rf"(?P<max>{_LIMIT_MAX})|(?P<min>{_LIMIT_MIN})", _I)
_CONSTRAINT_RE = re.compile(
    rf"\b(?:must|mustn't|never|only|cannot|can't|should not|shouldn't|no later than|avoid)\b"
    rf"|(?:^|\b(?:please|i|we|you|just)\s+)(?:don't|do not)\b(?!\s+(?:know|think|remember|care))"
    rf"|必须|不能|不要|(?<![特分区类告级识性差个])别(?![人的])|禁止|不得|(?<!不)只(?![是好])|仅|务必"
    rf"|一定要|不可以|不允许|不准|{_LIMIT_MAX}|{_LIMIT_MIN}",
    _I,
)
_ZH_DECISION = r"决定|(?<!不)确定|采用|就用|选用|就选|选定|定了|改用|换用|改成|改为|换成"
_DECISION_RE = re.compile(
    r"\b(?:decided|decide to|we'll use|we will use|we'll go with|we will go with|let's go with"
    r"|let's use|go with|going with|settled on|we'll take|i'll take|picked|chose)\b"
    rf"|{_ZH_DECISION}|^(?:我们|那就|那|就|还是)?用(?=\S)|^[{_CJK}]{{1,6}}用(?=[A-Za-z])",
    _I,
)
_UNDECIDED_RE = re.compile(
    r"not (?:yet )?decided|haven't decided|undecided|还没(?:有)?(?:决定|确定)|未定|待定", _I
)
_SUGGESTION_RE = re.compile(
    r"\b(?:maybe|perhaps|might|could|how about|what about|suggest|consider|should we|shall we)\b"
    r"|建议|考虑|要不|或许|也许|不如|是否|可能",
    _I,
)
_CORRECTION_RE = re.compile(
    r"\b(?:actually|instead|change(?:d)? (?:it )?to|switch(?:ed)? to|changed my mind|correction)\b"
    r"|改成|改为|换成|改用|换用|其实|还是用|更正",
    _I,
)
_OPEN_RE = re.compile(
    r"\b(?:todo|to-do|next|still need|still needs|pending|remaining|yet to"
    r"|not (?:yet )?(?:done|finished|completed|fixed))\b"
    r"|(?<![期等接招款对看])待|还没|尚未|下一步|接下来|还需要|未完成",
    _I,
)
_DONE_RE = re.compile(
    r"\b(?:done|finished|completed|fixed|resolved|booked|deployed|merged)\b"
    r"|已完成|完成了|搞定|做完|已经?(?:订好|预订|预定|处理|解决|修复|提交)",
    _I,
)
_AFFIRM_RE = re.compile(
    r"^\s*(?:yes|yeah|yep|ok|okay|sure|sounds good|agreed|go ahead|confirmed|deal|perfect"
    r"|好(?![久像])|可以|行(?![程李动])|没问题|同意|确认|就这样)",
    _I,
)
_RETRACT_RES = (
    re.compile(
        r"\b(?:don't|do not|doesn't|won't|not)\s+(?:(?:want|need|have|going|use|using|go|book|take"
        r"|to|with|be)\s+)*(?P<x>[^,;!?]+?)\s+(?:anymore|any more|any longer)\b",
        _I,
    ),
    re.compile(
        r"\bno longer\s+(?:(?:want|need|use|using|go|with|to)\s+)*(?P<x>[^,;!?]+?)(?=[,;.!?]|$)", _I
    ),
    re.compile(r"\binstead of\s+(?P<x>[^,;!?]+?)(?=[,;.!?]|$)", _I),
    re.compile(r"不(?:再|想|要|用|需要|必|去|住|选|考虑)+(?P<x>[^，,。；！？]+?)了"),
    re.compile(r"(?P<x>[^，,。；！？]+?)不(?:要|用|需要)了"),
    re.compile(r"(?:取消了?|而不是)(?P<x>[^，,。；！？]+)"),
)
_MONTHS = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_UNITS = (
    r"(?i:km|kg|g|m|cm|mm|gb|mb|tb|kb|ms|min|mins|minutes?|hours?|hrs?|days?|nights?|weeks?"
    r"|months?|years?|people|persons?|rooms?|%)(?![A-Za-z])|个人|人|天|晚|夜|小时|分钟|公里|千米|米"
    r"|公斤|千克|克|岁|间|张|周"
)
_FACT_RE = re.compile(
    r"(?P<url>https?://[^\s，。；、）)\]\"'<>]+)|(?P<email>[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)"
    rf"|(?P<date>\d{{4}}[-/]\d{{1,2}}[-/]\d{{1,2}}|\d{{4}}年\d{{1,2}}月(?:\d{{1,2}}[日号])?"
    rf"|\d{{1,2}}月\d{{1,2}}[日号]|\b\d{{1,2}} {_MONTHS},? \d{{4}}\b"
    rf"|\b{_MONTHS} \d{{1,2}},? \d{{4}}\b)"
    r"|(?P<amount>[¥$€£] ?\d[\d,]*(?:\.\d+)?|\d[\d,]*(?:\.\d+)? ?(?:万元|元|块|美元|欧元"
    r"|(?i:usd|eur|cny|rmb|gbp|jpy|dollars?|euros?|yuan))(?![A-Za-z]))"
    r"|(?P<id>(?<![A-Za-z0-9])[A-Z]{1,5}-?\d{3,}(?:-\d+)*(?![A-Za-z0-9])|(?<![\d.])\d{5,}(?![\d.]))"
    rf"|(?P<quantity>\d+(?:\.\d+)? ?-? ?(?:{_UNITS}))"
)
_EN_TRAIL = frozenset(
    re.findall(
        r"\S+",
        "is are was were be been must should can could will would stay stays remain remains keep "
        "has have to need needs take takes cost costs last lasts spend it of with not do does "
        "shall may might always get set at for on about around approximately roughly equals "
        "actually ok okay so well now also",
    )
)
_ZH_TRAIL_RE = re.compile(
    r"(?:是|为|要|得|必须|应该|控制在|定在|定于|在|改成|改为|调整为|调到|也|都|就|还|可以|能|会"
    r"|总共|一共|共|大概|大约|约|可能|最好|尽量|：|:)+$"
)
_SLOT_RE = re.compile(r"\bfor (?:the |our |my |this )?([A-Za-z][\w-]*(?: [A-Za-z][\w-]*){0,2})")
_ZH_LEAD_RE = re.compile(
    r"^(?:其实|那么|那就|那|还是|我们|咱们|我|你|您|这次|另外|而且|但是|所以|最后|最终|嗯|好)+"
)


def _key(text: str) -> str | None:
    cleaned = re.sub(r"[\s_]+", " ", re.sub(r"[^\w\s.+@-]", " ", text.casefold())).strip(" .-")
    return cleaned[:40] or None


def _has_cjk(text: str) -> bool:
    return re.search(f"[{_CJK}]", text) is not None


def _noun_before(prefix: str, words_kept: int = 1) -> str | None:
    """The head of the noun phrase ending `prefix` ("The total budget is" -> "budget"), keeping
    the last `words_kept` English words ("My order number is" -> "order number" with 2)."""
    part = re.split(r"[,，:：;；]", prefix.rstrip(" :：=#\"'-"))[-1]
    part = re.split(r"[$¥€£\d]", part)[0].strip()
    if _has_cjk(part):
        part = _ZH_LEAD_RE.sub("", _ZH_TRAIL_RE.sub("", part).split("的")[-1])
        return part[-6:] or None
    words = [w.casefold() for w in re.findall(r"[A-Za-z][\w'-]*", part)]
    words = [w for w in words if w not in _EN_TRAIL and w not in ENGLISH_STOPWORDS]
    return " ".join(words[-words_kept:]) or None


def _unit_after(rest: str) -> str | None:
    match = re.match(rf"\s*([$¥€£])?\s*\d[\d,.]*\s*(?:个)?([A-Za-z]+|[{_CJK}])?", rest)
    if not match:
        return None
    return match.group(2) or ("amount" if match.group(1) else None)


def _first_words(rest: str, limit: int = 3) -> str:
    rest = re.split(r"[,，。;；!！?？]", rest)[0]
    if _has_cjk(rest):
        return re.sub(r"[了吧啊呢吗的\s]+$", "", rest.strip())[:8]
    stop = r"\b(?:for|in|at|on|because|since|as|instead|and|but|to|which|from|with)\b"
    return " ".join(terms(re.split(stop, rest, flags=_I)[0] or rest)[:limit])


def _constraint_subject(text: str) -> str | None:
    limit = _LIMIT_RE.search(text)
    if limit:
        noun = _noun_before(text[: limit.start()]) or _unit_after(text[limit.end() :])
        if noun:
            return f"{_key(noun)} ({'max' if limit.group('max') else 'min'})"
    marker = _CONSTRAINT_RE.search(text)
    return _key(_first_words(text[marker.end() :])) if marker else None


class _Extraction:
    """Accumulates items; earlier items (from `previous` and this run) resolve corrections."""

    def __init__(self, previous: Notes | None) -> None:
        self.found: dict[SectionName, list[NoteItem]] = {name: [] for name in SECTION_NAMES}
        self.context: list[tuple[SectionName, NoteItem]] = [
            (name, item) for name, items in (previous or Notes()).sections() for item in items
        ]

    def add(self, section: SectionName, text: str, seq: int, source: Source, subject: str | None,
            trusted: bool = True) -> None:  # fmt: skip
        item = NoteItem(text=text.strip(), seq=seq, subject=subject, source=source, trusted=trusted)
        self.found[section].append(item)
        self.context.append((section, item))

    def containing(self, needle: str) -> tuple[SectionName, NoteItem] | None:
        found = (e for e in reversed(self.context) if needle.casefold() in e[1].text.casefold())
        return next(
            (e for e in found if e[0] in ("goal", "constraints", "decisions", "open")), None
        )

    def decision_subject(self, text: str) -> str | None:
        slot, zh = _SLOT_RE.search(text), re.search(_ZH_DECISION + r"|就?用", text)
        if slot:
            return _key(slot.group(1))
        if zh:
            before = re.split(r"[，,]", text[: zh.start()])[-1].strip()
            head = _ZH_LEAD_RE.sub("", re.sub(r"(?:就|还是|都|也|先|我们|决定)+$", "", before))
            if head and len(head) <= 8 and not _CORRECTION_RE.search(head):
                return _key(head)
        if _CORRECTION_RE.search(text):
            # A correction replaces the latest decision made with the same verb, else the latest.
            verb = re.search(r"用|选|\b(?:use|go with|take|pick)\b", text, _I)
            earlier = [i for s, i in reversed(self.context) if s == "decisions" and i.subject]
            same = [i for i in earlier if verb and verb.group(0).casefold() in i.text.casefold()]
            if same or earlier:
                return (same or earlier)[0].subject
        marker = _DECISION_RE.search(text)
        return _key(_first_words(text[marker.end() :] if marker else text))

    def facts(self, text: str, seq: int, source: Source, trusted: bool) -> None:
        for clause in _CLAUSE_SPLIT_RE.split(text):
            matches = list(_FACT_RE.finditer(clause))
            for n, match in enumerate(matches):
                # The entity's segment runs from the previous entity (its label and hedges come
                # before it); the last one also keeps the clause's tail ("per night", "吧").
                start = matches[n - 1].end() if n else 0
                end = match.end() if n + 1 < len(matches) else len(clause)
                segment = re.sub(
                    r"^[\s\"'{}\[\],]*(?:and|和|及|以及|还有)?\s*", "", clause[start:end]
                )
                label = _noun_before(clause[start : match.start()], 2)
                kind = match.lastgroup or "fact"
                subject = _key(label) if label else _key(f"{kind}:{match.group(0)}")
                self.add("facts", segment.strip(" \"'{}[],"), seq, source, subject, trusted)

    def user_sentence(self, text: str, seq: int) -> None:
        captured = False
        if _GOAL_RE.search(text):
            self.add("goal", text, seq, "user", None)
            captured = True
        negated = next((m.group("x").strip() for r in _RETRACT_RES if (m := r.search(text))), None)
        target = self.containing(negated) if negated and len(negated) >= 2 else None
        if target:
            self.add(target[0], text, seq, "user", target[1].subject)
            return
        is_decision = (
            bool(_DECISION_RE.search(text))
            and not _SUGGESTION_RE.search(text)
            and not _UNDECIDED_RE.search(text)
            and not text.rstrip().endswith(("?", "？"))
        )
        if is_decision:
            self.add("decisions", text, seq, "user", self.decision_subject(text))
            captured = True
        if _CONSTRAINT_RE.search(text) or (negated and not is_decision):
            subject = _constraint_subject(text) if _CONSTRAINT_RE.search(text) else None
            self.add("constraints", text, seq, "user", subject or _key(negated or ""))
            captured = True
        if not captured:
            self.progress(text, seq, "user")
            self.facts(text, seq, "user", True)

    def progress(self, text: str, seq: int, source: Source) -> None:
        if _OPEN_RE.search(text) or _UNDECIDED_RE.search(text):
            self.add("open", text, seq, source, None)
        elif _DONE_RE.search(text):
            self.add("done", text, seq, source, None)

    def confirm(self, proposal_turn: TurnRecord, seq: int) -> None:
        proposals = [
            s
            for s in sentences(proposal_turn.content)
            if _DECISION_RE.search(s) or _SUGGESTION_RE.search(s)
        ]
        if len(proposals) == 1:
            text = f"User confirmed: {proposals[0]}"
            self.add("decisions", text, seq, "user", self.decision_subject(proposals[0]))


def sentences(text: str) -> list[str]:
    """Split on . ! ? ; 。！？；and newlines, keeping each sentence's own punctuation."""
    return [s.strip() for s in _SENTENCE_SPLIT_RE.split(text) if s and s.strip()]


def _flatten(value: Any, path: str = "") -> list[str]:
    if isinstance(value, dict):
        return [line for k, v in value.items() for line in _flatten(v, f"{path}{k}: ")]
    if isinstance(value, list):
        return [line for v in value for line in _flatten(v, path)]
    return [f"{path}{value}"]


def _tool_lines(content: str) -> list[str]:
    """Tool output as lines; JSON objects are flattened to `key: value` lines."""
    try:
        return _flatten(json.loads(content))
    except (ValueError, TypeError):
        return sentences(content)


def extract(turns: Sequence[TurnRecord], previous: Notes | None = None) -> Notes:
    """Fresh notes from `turns` (oldest first); `previous` only helps resolve corrections that
    refer to items extracted earlier. The result is already merged (corrections applied)."""
    run = _Extraction(previous)
    ordered = sorted(turns, key=lambda t: t.seq)
    for index, turn in enumerate(ordered):
        if turn.role == "user":
            before = ordered[index - 1] if index else None
            affirms = _AFFIRM_RE.search(turn.content) and not _SUGGESTION_RE.search(turn.content)
            if affirms and before and before.role == "assistant":
                run.confirm(before, turn.seq)
            for sentence in sentences(turn.content):
                run.user_sentence(sentence, turn.seq)
        elif turn.role == "assistant":
            for sentence in sentences(turn.content):
                run.progress(sentence, turn.seq, "assistant")
        elif turn.role == "tool":
            for line in _tool_lines(turn.content):
                run.facts(line, turn.seq, "tool", False)
    return merge(Notes(), Notes(**run.found))
