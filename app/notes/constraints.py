"""Constraints in a user sentence (pure): health facts, deadlines, hard limits and negations,
preferences, and the subject each is kept under ("budget (max)", "health: peanut", "deadline:
report", "likes: aisle seat")."""

import re

from app.domain.text import ENGLISH_STOPWORDS
from app.notes.sentences import (
    CJK,
    COMMIT_RE,
    TIME_RE,
    first_words,
    head_noun,
    noun_before,
    singular,
    subject_key,
)

_LIMIT_MAX = (
    r"\b(?:at most|no more than|not (?:to )?exceed|within(?= (?:the |our |my )?budget| ?[$¥€£]?\d)"
    r"|maximum|max"
    r"|(?:under|below|up to|less than|fewer than)(?= ?[$¥€£]?\d))\b"
    r"|不超过|不得超过|不能超过|最多|以内|之内|以下|不多于|不高于|上限"
)
_LIMIT_MIN = (
    r"\b(?:at least|no less than|minimum|(?:more than|over|above)(?= ?[$¥€£]?\d))\b"
    r"|至少|最少|不少于|不低于|以上|下限"
)
_LIMIT_RE = re.compile(rf"(?P<max>{_LIMIT_MAX})|(?P<min>{_LIMIT_MIN})")
_CONSTRAINT_RE = re.compile(
    rf"\b(?:must(?!'ve been| have been| be (?:so|really|very|nice|great|hard|fun|tough))"
    rf"|mustn't|never|only"
    rf"|(?:cannot|can't)(?! wait| believe| help| imagine| stop)|should not|shouldn't"
    rf"|no later than|avoid"
    rf"|has to|have to)\b"
    rf"|(?:^|\b(?:please|i|we|you|just)\s+)(?:don't|do not)\b(?!\s+(?:know|think|remember|care))"
    rf"|^(?:please\s+)?no\s+\w+\s+(?:after|before|during|on|at|in|without|unless|until)\b"
    rf"|必须|不能|不要|(?<![特分区类告级识性差个])别(?![人的])|禁止|不得|(?<!不)只(?![是好])|仅|务必"
    rf"|一定要|不可以|不允许|不准|千万|绝对不|{_LIMIT_MAX}|{_LIMIT_MIN}"
)
_HEALTH_RE = re.compile(
    r"\ballerg(?:y|ies|ic)\b|\bintoleran(?:t|ce)\b|\bdiabet(?:es|ic)\b|\basthma(?:tic)?\b"
    r"|\bc(?:o)?eliac\b|\bepilep(?:sy|tic)\b|\bpregnant\b|\bhypertension\b"
    r"|\bhigh blood pressure\b|\bheart condition\b|\breacts? badly to\b|\banaphyla\w*"
    r"|过敏|不耐受|糖尿病|高血压|哮喘|心脏病|癫痫|怀孕|孕妇|忌口"
)
_ALLERGEN_RES = (
    re.compile(r"\b(?:allergic|reacts? badly|intolerant) to (?:the |any )?(?P<x>[\w-]+)"),
    re.compile(r"\b(?P<x>[\w-]+) (?:allergy|allergies|intolerance)\b"),
    re.compile(r"\bno (?P<x>[\w-]+)\b.*\ballergic\b"),
    re.compile(rf"对(?P<x>[{CJK}A-Za-z]{{1,6}}?)(?:严重|有点|特别)?过敏"),
    re.compile(rf"(?:不能吃|不能喝|不能碰)(?P<x>[{CJK}]{{1,6}}?)[，,。]"),
    re.compile(rf"(?P<x>[{CJK}]{{1,4}}?)(?:严重|有点)?过敏"),
)
_HEALTH_NOISE_RE = re.compile(
    r"^(?:我|我们|家里有人|家里|孩子|有|的|一点|女儿|儿子|老婆|老公|妈妈|爸爸|母亲|父亲)+"
)
_PREFER_RE = re.compile(
    r"\b(?P<pos>(?:i|we)\s+(?:really\s+|much\s+|also\s+|do\s+|always\s+|usually\s+)?"
    r"(?:prefer|like|love|enjoy|adore)(?!\s+(?:that|how|when|what|it when|the way)\b)"
    r"|(?:i'd|i would|we'd|we would)\s+(?:rather(?: have)?|prefer|(?:like|love)(?!\s+to\b))"
    r"|my favou?rites? (?:is|are)|(?:always|usually|normally)\s+(?:go for|choose|pick|order))\b"
    r"|\b(?P<neg>(?:i|we)\s+(?:really\s+)?(?:don't|do not|never)\s+(?:like|enjoy|eat|drink)"
    r"|(?:i|we)\s+(?:hate|dislike|can't stand|cannot stand|detest)"
    r"|^(?:please\s+)?no\s+(?=[\w\s-]+(?:,\s*|\s+)please\b)|^please\s+no)\b"
    r"|(?P<zpos>(?<!不)(?:更|比较|最|很|都)?喜欢|偏好|偏爱|爱吃|爱喝|最好是|一般选|通常选|习惯|倾向于?)"
    r"|(?P<zneg>不喜欢|讨厌|受不了|不爱|不吃|不喝)"
)
_DEADLINE_RE = re.compile(
    r"\b(?:due|deadline|no later than|at the latest|latest by|cut-?off|closes? on|last day"
    r"|expires?|expiry)\b|截止|最迟|最晚|期限|到期|关闭"
)


def _unit_after(rest: str) -> str | None:
    match = re.match(rf"\s*([$¥€£])?\s*\d[\d,.]*\s*(?:个)?([A-Za-z]+|[{CJK}])?", rest)
    if not match:
        return None
    return match.group(2) or ("amount" if match.group(1) else None)


def _constraint_subject(text: str) -> str | None:
    limit = _LIMIT_RE.search(text)
    if limit:
        noun = noun_before(text[: limit.start()]) or _unit_after(text[limit.end() :])
        if noun:
            return f"{subject_key(noun)} ({'max' if limit.group('max') else 'min'})"
    marker = _CONSTRAINT_RE.search(text)
    return subject_key(first_words(text[marker.end() :])) if marker else None


def _health_subject(text: str) -> str:
    for pattern in _ALLERGEN_RES:
        match = pattern.search(text)
        if match:
            what = _HEALTH_NOISE_RE.sub("", match.group("x")).strip()
            if what and what.casefold() not in ENGLISH_STOPWORDS:
                return f"health: {subject_key(singular(what) if len(what) > 4 else what)}"
    condition = _HEALTH_RE.search(text)
    return f"health: {subject_key(condition.group(0) if condition else text)}"


def _preference_subject(match: re.Match[str], text: str) -> str | None:
    head = head_noun(text[match.end() :])
    polarity = "dislikes" if match.group("neg") or match.group("zneg") else "likes"
    return f"{polarity}: {head}" if head else None


def _deadline_subject(text: str, marker: re.Match[str]) -> str:
    noun = noun_before(text[: marker.start()], 2)
    if not noun:
        what = re.search(r"\bfor (?:the |my |our )?([A-Za-z][\w-]*)", text[marker.end() :])
        noun = what.group(1) if what else None
    return f"deadline: {subject_key(noun)}" if noun else "deadline"


def constraint(text: str, negated: str | None) -> str | None:
    """The subject of the constraint `text` (lowered) states ("" when it has none), or
    None."""
    if _HEALTH_RE.search(text):
        return _health_subject(text)
    deadline = _DEADLINE_RE.search(text)
    if deadline and TIME_RE.search(text) and not COMMIT_RE.search(text):
        return _deadline_subject(text, deadline)
    if _CONSTRAINT_RE.search(text):
        prefer = _PREFER_RE.search(text)
        if prefer and (prefer.group("neg") or prefer.group("zneg")):
            return _preference_subject(prefer, text) or ""
        return _constraint_subject(text) or ""
    prefer = _PREFER_RE.search(text)
    if prefer and (subject := _preference_subject(prefer, text)):
        return subject  # "I like it" names nothing: not a preference
    if negated:
        return subject_key(negated) or ""
    return None
