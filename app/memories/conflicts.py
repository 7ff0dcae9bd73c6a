"""Which remembered statements contradict each other (pure, English and Chinese): the slot a
statement is about and its value, and `contradicts(old, new)`.

Slots: `name`, `home` (where the user lives: "I live in Paris", "we moved to Lyon", "我住在上海",
"搬到了杭州"), `email`, `phone`, `employer`, `budget` (an amount: "$5,000", "5k", "5 万", "八万"),
`deadline`, `allergy` and `preference:<thing>` ("I prefer aisle seats" is about seats;
"I hate cilantro" about cilantro; "我喜欢靠窗的座位" about 座位).

Two statements contradict when they are about the same slot and cannot both hold:
- one value per slot (name, home, email, phone, employer, budget, deadline, a preference between
  kinds of one thing, a favourite): a different value contradicts ("I live in Paris" … "we moved
  to Lyon"; 预算 5 万 … 预算改成 8 万);
- the same value said and unsaid contradicts ("I like cilantro" … "I hate cilantro"; "allergic to
  peanuts" … "no longer allergic to peanuts");
- allergies add up ("allergic to peanuts" and "allergic to shellfish" both hold), but "no
  allergies" contradicts every allergy, and an allergy contradicts an earlier "no allergies";
- likes add up too ("I like tea", "I like coffee").
Values in different scripts ("Paris", "巴黎") are not compared. A statement with no slot the
rules know contradicts nothing here; where the rules say nothing about a pair (`rules_silent`:
"I'm vegetarian" … "I had steak yesterday"), the optional LLM judge
(`app.memories.conflict_judge`) may be asked about the few items `judge_candidates` picks.

The caller (the memories lifecycle) asks, for a new item, which active items of the same owner
`contradicts(old.text, new.text)`; the newer supersedes the older when its source is at least as
trusted, else both are shown with their dates.
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.text import ascii_lower, term_set

_CJK = "\u4e00-\u9fff"
_END = r"(?=[,.;!?，。；！？]|\s+(?:now|and|but|since|for|last|this|these|because|with)\b|$)"
_ZH_END = r"(?=[，。；！？,.;!?了啦呢吧]|$)"


@dataclass(frozen=True, slots=True)
class Statement:
    """What a statement says: its slot, its value (normalised) and whether it holds (False: the
    statement denies it — "not allergic to", "I don't like", "不喜欢")."""

    slot: str
    value: str
    holds: bool = True
    exclusive: bool = True  # one value at a time (False: values add up, allergies and likes)


_SPELLINGS = {"colour": "color", "favourite": "favorite", "flavour": "flavor", "centre": "center"}


def _clean(value: str) -> str:
    value = re.sub(r"^(?:the|a|an|my|our)\s+", "", value.strip(" \"'“”「」"))
    return " ".join(_SPELLINGS.get(w, w) for w in value.casefold().split())


def _comparable(a: str, b: str) -> bool:
    """Values in different scripts ("paris", "巴黎") may name one thing: the rules cannot tell."""
    return (re.search(f"[{_CJK}]", a) is None) == (re.search(f"[{_CJK}]", b) is None)


def _singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("shes", "ches", "sses", "xes")):
        return word[:-2]
    return word[:-1] if word.endswith("s") and not word.endswith("ss") and len(word) > 3 else word


_ZH_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7,
              "八": 8, "九": 9, "十": 10}  # fmt: skip
_MULTIPLIERS = {"k": 1_000, "千": 1_000, "m": 1_000_000, "万": 10_000, "w": 10_000,
                "百万": 1_000_000, "亿": 100_000_000}  # fmt: skip
_AMOUNT_RE = re.compile(
    r"(?P<number>\d[\d,]*(?:\.\d+)?|[零一二两三四五六七八九十]+)\s*"
    r"(?P<unit>百万|k\b|m\b|w\b|千|万|亿)?"
)


def _amount(text: str) -> str | None:
    """The first amount of `text` as a plain number ("5 万" -> "50000", "$5,000" -> "5000")."""
    match = _AMOUNT_RE.search(text)
    if not match:
        return None
    raw = match.group("number")
    if raw[0].isdigit():
        number = float(raw.replace(",", ""))
    elif raw.startswith("十"):
        number = 10 + _ZH_DIGITS.get(raw[1:2], 0)
    else:
        number = _ZH_DIGITS.get(raw[0], 0) * (10 if "十" in raw else 1)
        number += _ZH_DIGITS.get(raw[-1], 0) if "十" in raw and raw[-1] != "十" else 0
    number *= _MULTIPLIERS.get(match.group("unit") or "", 1)
    return f"{number:g}" if number != int(number) else str(int(number))


_EN_VALUE = r"(?P<v>[a-z][\w' -]*?)"
_ZH_PLACE = rf"(?P<v>[{_CJK}A-Za-z]{{2,12}}?){_ZH_END}"
_CHANGED = r"(?:是|为|改成了?|换成了?|改为)[：:]?\s*"
_EMAIL = r"(?P<v>[\w.+-]+@[\w.-]+\w)"
# (slot, pattern with a `v` group): the first that matches gives the statement.
_SLOT_PATTERNS: tuple[tuple[str, str], ...] = (
    ("name", rf"\b(?:my name is|my name's|call me|i'm called|i am called)\s+{_EN_VALUE}{_END}"),
    (
        "home",
        r"\b(?:i|we)\s+(?:now\s+|still\s+|currently\s+)?(?:live|living|reside|stay"
        rf"|am based|are based|'m based|'re based)\s+in\s+{_EN_VALUE}{_END}",
    ),
    (
        "home",
        r"\b(?:i|we)\s+(?:just\s+|recently\s+|have\s+|'ve\s+)?(?:moved|relocated)\s+"
        rf"(?:back\s+)?to\s+{_EN_VALUE}{_END}",
    ),
    (
        "home",
        r"\b(?:my|our)\s+(?:home|home address|address)\s+is(?:\s+now)?\s+"
        r"(?P<v>\w[\w' ,-]*?)(?=[.;!?]|$)",
    ),
    ("email", rf"\b(?:my|our)\s+(?:new\s+)?e-?mail(?: address)?\s+is(?:\s+now)?\s+{_EMAIL}"),
    (
        "phone",
        r"\b(?:my|our)\s+(?:new\s+)?(?:phone|mobile|cell)(?: number)?\s+is(?:\s+now)?\s+"
        r"(?P<v>\+?\d[\d ()-]{4,}\d)",
    ),
    ("employer", rf"\bi\s+(?:now\s+)?work\s+(?:at|for)\s+(?P<v>[a-z][\w'&. -]*?){_END}"),
    ("budget", r"\bbudget\b[^.;!?]*?(?P<v>[$€£¥]?\s*\d[\d,]*(?:\.\d+)?\s*(?:k\b|m\b)?)"),
    (
        "deadline",
        r"\b(?:deadline|due date)\s+(?:is|was|moved to|changed to|now)(?:\s+now)?\s+"
        rf"(?P<v>\w[\w ,-]*?){_END}",
    ),
    (
        "deadline",
        rf"\b(?:it's|it is|the \w+ is|is)\s+due\s+(?:on\s+|by\s+)?(?P<v>\w[\w ,-]*?){_END}",
    ),
    ("name", rf"(?:我叫|我的名字是|我的名字叫|叫我)(?P<v>[{_CJK}A-Za-z]{{1,8}}?){_ZH_END}"),
    ("home", rf"(?:我|我们)(?:现在|目前|一直)?(?:住在|定居在|住){_ZH_PLACE}"),
    ("home", rf"(?:搬到了?|搬去了?|搬家到|迁到了?){_ZH_PLACE}"),
    (
        "home",
        rf"(?:我家在|我的地址是|我的住址是|地址改成了?|现居)(?P<v>[{_CJK}A-Za-z\d]{{2,20}}?)"
        rf"{_ZH_END}",
    ),
    ("email", rf"(?:邮箱|电子邮件|email)(?:地址)?{_CHANGED}{_EMAIL}"),
    ("phone", rf"(?:手机号?|电话)(?:号码)?{_CHANGED}(?P<v>\+?\d[\d -]{{4,}}\d)"),
    ("employer", rf"我(?:现在)?在(?P<v>[{_CJK}A-Za-z]{{2,12}}?)(?:工作|上班){_ZH_END}"),
    (
        "budget",
        r"预算[^，。；！？]*?(?P<v>\d[\d,]*(?:\.\d+)?\s*(?:百万|千|万|亿|w|k)?"
        r"|[零一二两三四五六七八九十]+\s*(?:百万|千|万|亿))",
    ),
    (
        "deadline",
        r"(?:截止日期|截止时间|截止|最后期限|期限|deadline)(?:是|改成了?|改到了?|为|定在|到)"
        rf"[：:]?(?P<v>[{_CJK}\d]{{1,12}}?){_ZH_END}",
    ),
)
_SLOTS = tuple((slot, re.compile(pattern)) for slot, pattern in _SLOT_PATTERNS)

_NO_ALLERGY_RE = re.compile(
    r"\b(?:no|not any|don't have any|do not have any)\s+(?:known\s+)?allerg(?:y|ies)\b"
    r"|\bnot allergic to anything\b|没有(?:任何)?过敏|不过敏|无过敏|没什么过敏"
)
_ALLERGY_RES = (
    re.compile(
        r"\b(?P<neg>no longer |not |isn't |aren't |am not |not really )?allergic to "
        r"(?:the |any )?(?P<v>[a-z][\w-]*)"
    ),
    re.compile(r"\b(?P<v>[a-z][\w-]*) allerg(?:y|ies)\b"),
    re.compile(rf"(?P<neg>不再|已经不|不)?对(?P<v>[{_CJK}A-Za-z]{{1,6}}?)(?:严重|有点|特别)?过敏"),
    re.compile(rf"(?P<v>[{_CJK}]{{1,4}}?)(?P<neg>不)?过敏"),
)
_ALLERGY_NOISE_RE = re.compile(r"^(?:我|我们|有|的|孩子|家里|也|还|都)+")
_NOW = r"(?:now\s+|really\s+|still\s+|also\s+)?"
_PREFER_RES = (
    # "I prefer aisle seats", "我更喜欢靠窗的座位": one kind of a thing over others (exclusive).
    re.compile(
        rf"\b(?:i|we)\s+{_NOW}(?P<neg>no longer |don't |do not )?prefer\s+(?:the\s+|an?\s+)?"
        r"(?P<v>[a-z][\w-]*)\s+(?P<thing>[a-z][\w-]*)"
    ),
    re.compile(
        r"\b(?:my\s+)?favou?rite\s+(?P<thing>[a-z][\w-]*)\s+is(?:\s+now)?\s+"
        r"(?P<v>[a-z][\w' -]*?)(?=[,.;!?]|$)"
    ),
    re.compile(
        rf"(?P<neg>不再)?(?:更喜欢|偏好|更偏爱|倾向于)(?P<v>[{_CJK}]{{1,6}}?)的"
        rf"(?P<thing>[{_CJK}]{{1,4}}){_ZH_END}"
    ),
    re.compile(
        rf"最喜欢的(?P<thing>[{_CJK}]{{1,4}})(?:是|换成了?)(?P<v>[{_CJK}A-Za-z]{{1,8}}?){_ZH_END}"
    ),
)
_LIKE_RES = (
    # "I like / hate cilantro", "我不喜欢香菜": likes add up; one said and unsaid contradicts.
    re.compile(
        rf"\b(?:i|we)\s+{_NOW}(?P<neg>don't like|do not like|dislike|hate|can't stand"
        r"|no longer like|don't eat|do not eat|don't enjoy)\s+(?P<v>[a-z][\w-]*)"
    ),
    re.compile(rf"\b(?:i|we)\s+{_NOW}(?:like|love|enjoy|adore)\s+(?P<v>[a-z][\w-]*)"),
    re.compile(rf"(?P<neg>不喜欢|讨厌|受不了|不爱|不吃|不再喜欢)(?P<v>[{_CJK}]{{1,6}}?){_ZH_END}"),
    re.compile(rf"(?:喜欢|爱吃|爱喝|爱)(?P<v>[{_CJK}]{{1,6}}?){_ZH_END}"),
)
_NOT_OBJECTS = frozenset("to it that this the a an when how what".split())


def _allergy(low: str) -> Statement | None:
    if _NO_ALLERGY_RE.search(low):
        return Statement("allergy", "none", exclusive=False)
    for pattern in _ALLERGY_RES:
        match = pattern.search(low)
        if match:
            what = _ALLERGY_NOISE_RE.sub("", match.group("v"))
            if what and what not in ("an", "any", "no", "food", "my"):
                holds = not match.groupdict().get("neg")
                return Statement("allergy", _singular(_clean(what)), holds, exclusive=False)
    return None


def _preference(low: str) -> Statement | None:
    for pattern in _PREFER_RES:
        match = pattern.search(low)
        if match:
            holds = not match.groupdict().get("neg")
            thing = _singular(_clean(match.group("thing")))
            return Statement(f"preference:{thing}", _clean(match.group("v")), holds)
    for pattern in _LIKE_RES:
        match = pattern.search(low)
        if match and match.group("v") not in _NOT_OBJECTS:
            value = _singular(_clean(match.group("v")))
            holds = not match.groupdict().get("neg")
            return Statement(f"preference:{value}", value, holds, exclusive=False)
    return None


def _slot_value(slot: str, raw: str) -> str:
    if slot == "budget":
        return _amount(ascii_lower(raw)) or _clean(raw)
    if slot == "phone":
        return re.sub(r"\D", "", raw)
    return _clean(raw)


def statement(text: str) -> Statement | None:
    """The slot `text` is about and its value, or None when no rule knows its slot."""
    low = ascii_lower(text).strip()
    found = _allergy(low)
    if found:
        return found
    for slot, pattern in _SLOTS:
        match = pattern.search(low)
        if match and match.group("v").strip():
            return Statement(slot, _slot_value(slot, match.group("v")))
    return _preference(low)


def _clash(old: Statement, new: Statement) -> bool:
    if old.slot != new.slot:
        return False
    if old.value == new.value:
        return old.holds != new.holds
    if old.slot == "allergy":  # allergies add up; "no allergies" denies them all
        return (old.value == "none" and new.holds) or (new.value == "none" and old.holds)
    if not _comparable(old.value, new.value):
        return False
    return old.exclusive and new.exclusive and old.holds and new.holds


def contradicts(old: str, new: str) -> bool:
    """True when `new` cannot hold together with `old` (the rules of the module docstring)."""
    before, after = statement(old), statement(new)
    return before is not None and after is not None and _clash(before, after)


def rules_silent(old: str, new: str) -> bool:
    """True when the rules cannot tell whether `new` contradicts `old`: one of them has no slot
    the rules know, or they are about different slots."""
    before, after = statement(old), statement(new)
    return before is None or after is None or before.slot != after.slot


def judge_candidates(new: str, olds: Sequence[str], limit: int) -> list[int]:
    """The indexes of at most `limit` of `olds` (oldest first) an LLM judge is asked about for
    `new`: those the rules are silent about, the ones sharing most words with `new` first, then
    the newest. Words alone would miss a contradiction about one subject in other words ("I'm
    vegetarian" … "I had steak"), so an item sharing none may still be asked about."""
    new_terms = term_set(new)
    silent = [i for i, old in enumerate(olds) if rules_silent(old, new)]
    ranked = sorted(silent, key=lambda i: (len(new_terms & term_set(olds[i])), i), reverse=True)
    return ranked[:limit]
