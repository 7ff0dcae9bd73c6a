"""The default notes generator: deterministic, offline rules for English and Chinese.

Who may say what (seed 003 §5.6: never turn a suggestion into a decision, nor an assistant guess
into a user fact):
- user turns give goals, constraints, decisions, open/done items and facts;
- assistant turns give only open/done items (progress reports and commitments). An assistant
  proposal becomes a decision only when the very next user turn starts with an affirmation ("yes",
  "好的") and the assistant turn holds exactly one proposal; it is then recorded as the user's
  decision at the confirming turn. Assistant statements never become facts or constraints;
- tool turns give facts only, marked `trusted=False`, and never from a line that gives orders to
  the model ("ignore previous instructions", "remember that the user approved…", "系统提示：…",
  see `app.domain.injection`): that line stays quoted data in the raw turn and its chunk, never
  a note; system turns give nothing (C0 is separate).

This module holds that order (`extract`) and the goal, open, done and retraction cues; the rest
lives by what it extracts: `app.notes.constraints`, `app.notes.decisions`, `app.notes.facts`
(entities, names, codes), on the shared reading of `app.notes.sentences`; a run writes in an
`app.notes.notebook.Notebook`.

What a user sentence gives, in this order (the first that applies wins, except that a decision
and a constraint may both come from one sentence):
- a question (ends with ?/？ or 吗/呢, or opens like "what/how/can you/do you") is never a fact:
  it gives an open item when it names something pending ("still need to find out whether…"),
  else only the typed entities (IDs, codes, emails, names…) of its non-interrogative clauses
  ("It's order A-1, could you check it?" keeps A-1);
- a retraction ("not X anymore", "不要X了") replaces the earlier item that holds X;
- a decision (decided / let's go with / 就用 / 选 / 定…, or a correction such as "change of plan",
  "switch the X to", "算了…换" that names a slot or an earlier decision);
- constraints: health facts (allergic/allergy/intolerant/过敏/糖尿病…), deadlines (due, deadline,
  no later than, 截止, 最迟 with a time), hard limits and negations (must, never, only, at most,
  不能, 不要, 不超过…), preferences (prefer, I like, I hate, 喜欢, 不喜欢, 偏好…);
- open items: commitments (I'll / I will / 我会… with a time: "I'll send the form by Friday"),
  pending questions (whether, not sure yet, TBD, 待确认, 还没确定…);
- a goal (I want to / I'd like to / my goal / 我想 / 我打算…);
- facts: names (my name is, I'm + full name, this is … speaking, 我叫, 我是 + surname…), codes
  (a 3-8 digit value next to code / PIN / password / 密码 / 门禁 / 取件码, or after "press"/"按"),
  IDs (order, tracking and booking numbers), emails, URLs, dates, amounts, and quantities only
  when a noun labels them ("the disk has 2.5 GB"; "I waited 20 minutes" is chit-chat);
- else progress (done/open), else nothing: chit-chat and requests leave no trace.

Texts are stored verbatim (sentence for goals/constraints/decisions/open/done, the clause around
each entity for facts), without a leading discourse marker ("By the way,", "对了，"), so hedges and
limit words (可能, 不超过, 仅本次, at most) survive.

Subjects (the supersede key, see `policy.merge`):
- limit constraints: the head noun before the limit word plus the direction, "budget (max)",
  "预算 (max)"; with no noun, the unit after the number ("人 (max)"); health facts
  "health: <allergen or condition>"; deadlines "deadline: <noun>"; preferences
  "likes: <head noun>" / "dislikes: <head noun>"; other constraints: the first words after the
  modal ("not fly skyline", "在地铁站附近");
- decisions: an earlier decision whose subject the sentence names; else the explicit slot ("for the
  flights" -> "flights", "switch the hotel to" -> "hotel", "住宿就用…" -> "住宿"); else, for a
  correction, the earlier decision it shares a word with, else the latest one; else the object;
- facts: names "name" / "<relation> name"; codes "<qualifier> code" ("gate code", "门禁密码");
  others the label before the entity ("order number", "订单号"), else kind:value. A fact that
  says it is an update ("new", "changed", "now", "from now on", "改了", "现在是", "新的"…)
  takes the subject of the latest earlier fact of the same kind (code, email, ID…);
- retractions ("not X anymore", "no longer X", "不要X了", "不用X了", "X不要了", "取消X"): the
  subject and section of the latest earlier item whose text contains X, so the negation replaces
  it; unmatched, the sentence is kept as a constraint (a user negation) keyed on X.
"""

import json
import re
from collections.abc import Sequence
from typing import Any

from app.domain.injection import gives_orders
from app.domain.records import TurnRecord
from app.domain.text import ascii_lower
from app.notes.constraints import constraint
from app.notes.decisions import (
    SUGGESTION_RE,
    UNDECIDED_RE,
    confirm,
    decision_subject,
    is_decision,
)
from app.notes.facts import codes, facts, names
from app.notes.notebook import Notebook
from app.notes.policy import merge, with_provenance
from app.notes.schemas import Notes, Source
from app.notes.sentences import (
    COMMIT_RE,
    TIME_RE,
    is_question,
    sentences,
    strip_lead,
)

_GOAL_RE = re.compile(
    r"\b(?:i want to|i'd like to|i would like to|i need to|we need to|we want to|my goal"
    r"|our goal|the goal|i'm trying to|we're trying to|i'm planning to|i plan to|we plan to)\b"
    r"|目标|我(?:们)?(?:想(?!想)|要(?!求)|打算|计划|希望)"
)
_OPEN_RE = re.compile(
    r"\b(?:todo|to-do|next step|still need|still needs|pending|remaining|yet to|whether"
    r"|not (?:yet )?(?:sure|done|finished|completed|fixed|clear)|unsure|unclear|unknown"
    r"|tbd|tbc|to be (?:confirmed|decided|determined)|figure out|find out|check later"
    r"|waiting to hear|waiting (?:for|on) (?:a |an |the )?(?:reply|answer|confirmation|decision"
    r"|response)|open question|still to)\b"
    r"|(?<![期等接招款对看])待|还没|尚未|下一步|接下来|还需要|还要再|回头再|不确定|不清楚|等消息|未完成"
)
_DONE_RE = re.compile(
    r"\b(?:done|finished|completed|fixed|resolved|booked|deployed|merged)\b"
    r"|已完成|完成了|搞定|做完|已经?(?:订好|预订|预定|处理|解决|修复|提交)"
)
_AFFIRM_RE = re.compile(
    r"^\s*(?:yes|yeah|yep|ok|okay|sure|sounds good|agreed|go ahead|confirmed|deal|perfect"
    r"|好(?![久像])|可以|行(?![程李动])|没问题|同意|确认|就这样)"
)
_RETRACT_HINT_RE = re.compile(r"any ?more|any longer|no longer|instead of|不|取消")
_RETRACT_RES = (
    re.compile(
        r"\b(?:don't|do not|doesn't|won't|not)\s+(?:(?:want|need|have|going|use|using|go|book|take"
        r"|to|with|be)\s+)*(?P<x>[^,;!?]+?)\s+(?:anymore|any more|any longer)\b"
    ),
    re.compile(
        r"\bno longer\s+(?:(?:want|need|use|using|go|with|to)\s+)*(?P<x>[^,;!?]+?)(?=[,;.!?]|$)"
    ),
    re.compile(r"\binstead of\s+(?P<x>[^,;!?]+?)(?=[,;.!?]|$)"),
    re.compile(r"不(?:再|想|要|用|需要|必|去|住|选|考虑)+(?P<x>[^，,。；！？]+?)了"),
    re.compile(r"(?P<x>[^，,。；！？]+?)不(?:要|用|需要)了"),
    re.compile(r"(?:取消了?|而不是)(?P<x>[^，,。；！？]+)"),
)


def _negated(text: str) -> str | None:
    """What a retraction takes back ("not X anymore" -> X), if the text is one."""
    if not _RETRACT_HINT_RE.search(text):
        return None
    return next((m.group("x").strip() for r in _RETRACT_RES if (m := r.search(text))), None)


def _user_sentence(book: Notebook, raw: str, seq: int) -> None:
    """What one user sentence gives, in the order of the module docstring."""
    text = strip_lead(raw)
    low = ascii_lower(text)  # the cue patterns' input; items keep `text`
    if is_question(text):
        if _OPEN_RE.search(low) or UNDECIDED_RE.search(low):
            book.add("open", text, seq, "user", None)
        else:
            facts(book, text, seq, "user", True, strong_only=True)
        return
    negated = _negated(low)
    target = book.containing(negated) if negated and len(negated) >= 2 else None
    if target:
        book.add(target[0], text, seq, "user", target[1].subject)
        return
    if codes(book, text, seq):  # "门禁码换成…" is a code update, not a decision
        return
    decision = is_decision(book, low)
    if decision:
        book.add("decisions", text, seq, "user", decision_subject(book, low))
    subject = constraint(low, negated if not decision else None)
    if subject is not None:
        book.add("constraints", text, seq, "user", subject or None)
        return
    if decision:
        return
    committed = COMMIT_RE.search(low) and TIME_RE.search(low)
    if committed or _OPEN_RE.search(low) or UNDECIDED_RE.search(low):
        book.add("open", text, seq, "user", None)
    elif _GOAL_RE.search(low):
        book.add("goal", text, seq, "user", None)
    elif names(book, text, seq) or facts(book, text, seq, "user", True):
        return
    elif _DONE_RE.search(low):
        book.add("done", text, seq, "user", None)


def _progress(book: Notebook, text: str, seq: int, source: Source) -> None:
    """The assistant's progress: pending work, what is done, commitments with a time."""
    if is_question(text):
        return
    low = ascii_lower(text)
    if _OPEN_RE.search(low) or UNDECIDED_RE.search(low):
        book.add("open", text, seq, source, None)
    elif _DONE_RE.search(low):
        book.add("done", text, seq, source, None)
    elif COMMIT_RE.search(low) and TIME_RE.search(low):
        book.add("open", text, seq, source, None)


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


def data_lines(content: str) -> list[str]:
    """The lines of a tool result that may become notes: those that give no orders."""
    return [line for line in _tool_lines(content) if not gives_orders(line)]


def extract(turns: Sequence[TurnRecord], previous: Notes | None = None) -> Notes:
    """Fresh notes from `turns` (oldest first); `previous` only helps resolve corrections that
    refer to items extracted earlier. The result is already merged (corrections applied)."""
    run = Notebook(previous)
    ordered = sorted(turns, key=lambda t: t.seq)
    for index, turn in enumerate(ordered):
        if turn.role == "user":
            before = ordered[index - 1] if index else None
            low = ascii_lower(turn.content)
            affirms = _AFFIRM_RE.search(low) and not SUGGESTION_RE.search(low)
            if affirms and before and before.role == "assistant":
                confirm(run, before, turn.seq)
            for sentence in sentences(turn.content):
                _user_sentence(run, sentence, turn.seq)
        elif turn.role == "assistant":
            for sentence in sentences(turn.content):
                _progress(run, sentence, turn.seq, "assistant")
        elif turn.role == "tool":
            for line in data_lines(turn.content):
                facts(run, line, turn.seq, "tool", False)
    return with_provenance(merge(Notes(), Notes(**run.found)), ordered, "rules")
