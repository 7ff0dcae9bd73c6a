"""Facts in a sentence (pure): typed entities (URLs, emails, dates, amounts, IDs, labelled
quantities), people's names and access codes, each kept with the clause around it under the label
that names it ("order number", "gate code", "name"); an update takes over the subject of the
latest earlier fact of its kind."""

import re

from app.domain.text import ENGLISH_STOPWORDS, ascii_lower
from app.notes.notebook import Notebook
from app.notes.schemas import Source
from app.notes.sentences import (
    CJK,
    CLAUSE_SPLIT_RE,
    EN_TRAIL,
    MONTHS,
    ZH_LEAD_RE,
    has_cjk,
    is_question,
    noun_before,
    subject_key,
)

_UPDATE_RE = re.compile(
    r"\b(?:changed|change to|updated?|now|new|reset|correction|corrected|from now on"
    r"|from today|no longer|instead)\b"
    r"|改了|改成|改为|更新|现在是|新的|重置|更正|换成|以后|从今天起|不再"
)
_UNITS = (
    r"(?i:km|kg|g|m|cm|mm|gb|mb|tb|kb|ms|min|mins|minutes?|hours?|hrs?|days?|nights?|weeks?"
    r"|months?|years?|people|persons?|rooms?|%)(?![A-Za-z])|个人|人|天|晚|夜|小时|分钟|公里|千米|米"
    r"|公斤|千克|克|岁|间|张|周"
)
_FACT_RE = re.compile(
    r"(?P<url>https?://[^\s，。；、）)\]\"'<>]{1,2048})"
    # Every repetition is bounded or anchored to the start of a run, so matching stays linear
    # in the text however long one run of letters, digits or punctuation is.
    r"|(?P<email>(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}"
    r"(?:\.[A-Za-z0-9-]{1,63}){1,8})"
    rf"|(?P<date>\d{{4}}[-/]\d{{1,2}}[-/]\d{{1,2}}|\d{{4}}年\d{{1,2}}月(?:\d{{1,2}}[日号])?"
    rf"|\d{{1,2}}月\d{{1,2}}[日号]|\b\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{MONTHS}(?:,? \d{{4}})?"
    rf"|\b{MONTHS} \d{{1,2}}(?:st|nd|rd|th)?\b(?:,? \d{{4}})?)"
    r"|(?P<amount>[¥$€£] ?\d[\d,]{0,24}(?:\.\d{1,6})?"
    r"|(?<!\d)\d[\d,]{0,24}(?:\.\d{1,6})? ?(?:万元|元|块|美元|欧元"
    r"|(?i:usd|eur|cny|rmb|gbp|jpy|dollars?|euros?|yuan))(?![A-Za-z]))"
    r"|(?P<id>#\d{4,}|(?<![A-Za-z0-9])(?:[A-Z]+\d|\d+[A-Z])[A-Z0-9]*(?:-[A-Z0-9]+)*(?<=\w{5})"
    r"(?![A-Za-z0-9])|(?<![A-Za-z0-9])[A-Z]{1,5}-\d{3,}(?:-\d+)*(?![A-Za-z0-9])"
    r"|(?<![\d.])\d{5,}(?!\d|\.\d))"
    rf"|(?P<quantity>(?<!\d)\d{{1,12}}(?:\.\d{{1,6}})? ?-? ?(?:{_UNITS}))"
)
_CODE_LABEL_RE = re.compile(
    r"\b(?:pin|passcode|password|pass code|code|combination)\b"
    r"|密码锁|密码|门禁码|门禁|取件码|通行码|验证码|开门码|口令"
)
_CODE_ENTRY_RE = re.compile(
    r"\b(?:buzz|dial|press|enter|key in|punch in|type in)\s+(?=[*#]?\d)|(?:按|输入)(?=[*#]?\d)"
)
_CODE_VALUE_RE = re.compile(r"(?<![A-Za-z0-9*#.-])[*#]?\d{3,8}[#*]?(?![A-Za-z0-9-]|\.\d)")
_NAME_WORD = r"[A-Z][a-z]+(?:[-'’][A-Z]?[a-z]+)?"
_NAME = rf"{_NAME_WORD}(?:\s+{_NAME_WORD}){{0,2}}"
_NAME_EN_RE = re.compile(
    rf"(?P<cue>(?i:\bmy name(?:'s| is)|\bcall me|\bfull name(?: is)?:?|\bname on the \w+ is"
    rf"|\b(?:account holder|recipient|contact person) is|\bthis is|\bi am|\bi'm))"
    rf"\s+(?P<name>{_NAME})"
    rf"|^(?P<here>{_NAME})\s+(?i:here|speaking)\b"
    rf"|(?i:\bmy)\s+(?P<rel>[a-z]+)(?i:'s name is| is called| is named| named| called)"
    rf"\s+(?P<relname>{_NAME})"
)
_NOT_NAMES = frozenset(
    "i the hi hello thanks thank sorry ok okay yes no monday tuesday wednesday thursday friday "
    "saturday sunday january february march april may june july august september october "
    "november december".split()
)
_SURNAMES = (
    "王李张刘陈杨黄赵周吴徐孙马胡郭林何高罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁"
    "任沈姚卢姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万钱严覃武"
    "戴莫孔向汤"
)
_ZH_RELATIONS = "女儿|儿子|老婆|老公|妻子|丈夫|妈妈|爸爸|母亲|父亲|孩子|先生|太太|朋友|同事"
_ZH_NAME = (
    rf"(?:欧阳|司马|上官|诸葛|东方|皇甫|尉迟|公孙|慕容|令狐|[{_SURNAMES}])[{CJK}]{{1,2}}?"
    rf"(?=[，。！？、,.!?\s]|$|[想要在是的了吧就，])"
)
_NAME_ZH_RE = re.compile(
    rf"(?:我的名字|名字)(?:是|叫)(?P<a>[{CJK}]{{2,4}}?)(?=[，。！？,.!?\s]|$)"
    rf"|我叫(?P<b>[{CJK}]{{2,3}}?)(?=[，。！？,.!?\s]|$|就)"
    rf"|(?:本人|我是|全名(?:是|叫)?|(?:^|[，,])叫|收件人(?:是|为)?[：:]?|联系人(?:是|为)?[：:]?)"
    rf"(?P<c>{_ZH_NAME})"
    rf"|我(?P<rel>{_ZH_RELATIONS})(?:的名字)?(?:叫|是)(?P<d>{_ZH_NAME})"
)
_SUBJECT_PRONOUNS = frozenset("i we you he she they i've we've i'd we'd i'm we're".split())
_COPULA = frozenset("is are was were has have weighs measures costs takes lasts equals".split())
_ZH_NARRATIVE_RE = re.compile(r"^[我你他她它]|[了完过着]$")


def _labels_quantity(prefix: str) -> bool:
    """A bare number with a unit is a fact only when a noun labels it: "the disk has 2.5 GB",
    "距离12 km" — not "I've been waiting for 20 minutes" nor "我都等了20分钟"."""
    part = re.split(r"[,，:：;；.。!！]", prefix)[-1].strip()
    if has_cjk(part):
        run = re.findall(f"[{CJK}]+", part)
        return bool(run) and not _ZH_NARRATIVE_RE.search(run[-1]) and not part.endswith(" ")
    words = [w.casefold() for w in re.findall(r"[A-Za-z][\w'-]*", part)]
    if words and words[-1] in _COPULA:
        words = words[:-1]
    narrative = len(words) > 1 and words[-2] in _SUBJECT_PRONOUNS  # "I slept 9 hours"
    return (
        bool(words)
        and not narrative
        and words[-1] not in EN_TRAIL
        and words[-1] not in ENGLISH_STOPWORDS
        and not words[-1].endswith(("ed", "ing"))
    )


def _fact_kind(text: str) -> str | None:
    """The kind of entity a fact text holds (for updates that replace the latest of a kind)."""
    low = ascii_lower(text)
    if _CODE_VALUE_RE.search(text) and (_CODE_LABEL_RE.search(low) or _CODE_ENTRY_RE.search(low)):
        return "code"
    match = _FACT_RE.search(text)
    return match.lastgroup if match else None


def facts(
    book: Notebook, text: str, seq: int, source: Source, trusted: bool, strong_only: bool = False
) -> bool:
    """Typed entities of `text` as facts; True when any was found."""
    found = False
    for clause in CLAUSE_SPLIT_RE.split(text):
        if strong_only and is_question(clause):
            continue
        matches = [
            m
            for m in _FACT_RE.finditer(clause)
            if m.lastgroup != "quantity"
            or (not strong_only and _labels_quantity(clause[: m.start()]))
        ]
        for n, match in enumerate(matches):
            # The entity's segment runs from the previous entity (its label and hedges come
            # before it); the last one also keeps the clause's tail ("per night", "吧").
            start = matches[n - 1].end() if n else 0
            end = match.end() if n + 1 < len(matches) else len(clause)
            segment = re.sub(r"^[\s\"'{}\[\],]*(?:and|和|及|以及|还有)?\s*", "", clause[start:end])
            label = noun_before(clause[start : match.start()], 2)
            kind = match.lastgroup or "fact"
            subject = subject_key(label) if label else subject_key(f"{kind}:{match.group(0)}")
            if source == "user" and _UPDATE_RE.search(ascii_lower(text)):
                subject = _updated_subject(book, kind) or subject
            book.add("facts", segment.strip(" \"'{}[],"), seq, source, subject, trusted)
            found = True
    return found


def _updated_subject(book: Notebook, kind: str) -> str | None:
    """The subject of the latest earlier fact of this kind (an update replaces it)."""
    return next((i.subject for i in book.earlier("facts") if _fact_kind(i.text) == kind), None)


def names(book: Notebook, text: str, seq: int) -> bool:
    """People's names a user sentence gives ("my name is …", "我叫…") as facts; True when any."""
    found = False
    for clause in CLAUSE_SPLIT_RE.split(text):
        subject = None
        if has_cjk(clause):
            match = _NAME_ZH_RE.search(clause)
            if match:
                subject = f"{match.group('rel')} name" if match.group("rel") else "name"
        else:
            for match in _NAME_EN_RE.finditer(clause):
                name = match.group("name") or match.group("here") or match.group("relname")
                cue = (match.group("cue") or "").casefold()
                if name.split()[0].casefold() in _NOT_NAMES:
                    continue
                if cue in ("this is", "i am", "i'm") and len(name.split()) < 2:
                    continue
                subject = f"{match.group('rel').casefold()} name" if match.group("rel") else "name"
                break
        if subject:
            book.add("facts", clause.strip(" ,，"), seq, "user", subject_key(subject))
            found = True
    return found


def codes(book: Notebook, text: str, seq: int) -> bool:
    """A user sentence that gives a code (PIN, gate code, 取件码…) as one fact; True if so."""
    low = ascii_lower(text)
    label = _CODE_LABEL_RE.search(low)
    entry = _CODE_ENTRY_RE.search(low)
    if not _CODE_VALUE_RE.search(text) or not (label or entry):
        return False
    if label and has_cjk(text):
        run = re.findall(f"[{CJK}]+", low[: label.end()])
        qualifier = ZH_LEAD_RE.sub("", run[-1] if run else label.group(0))
        subject = subject_key(qualifier[-8:])
    elif label:
        after = re.match(
            r"\s+(?:for|of) (?:the |my |our )?([a-z]+(?: [a-z]+)?)", low[label.end() :]
        )
        noun = after.group(1) if after else noun_before(low[: label.start()])
        subject = subject_key(f"{noun} {label.group(0)}" if noun else label.group(0))
    else:
        subject = "code"
    if _UPDATE_RE.search(low):
        subject = _updated_subject(book, "code") or subject
    book.add("facts", text, seq, "user", subject)
    return True
