"""How the notes rules read text (pure): sentences and clauses, the ASCII lowering the cue patterns
run on, discourse markers, questions, times and commitments, and the noun phrases that become an
item's subject (its supersede key, see `app.notes.policy.merge`)."""

import re

from app.domain.text import ENGLISH_STOPWORDS, ascii_lower, terms

_I, CJK = re.IGNORECASE, "\u4e00-\u9fff"
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])|\n+")
CLAUSE_SPLIT_RE = re.compile(r"[，；]|[,;](?=\s*[^\s\d])")
_LEAD_RE = re.compile(
    r"^(?:(?:oh|ah|and|also|btw|by the way|one more thing|another thing|plus|p\.?s\.?|fyi"
    r"|one last thing|just so you know|anyway|additionally|besides|ok|okay|right|well)\b"
    r"[\s,:;—-]*)+"
    r"|^(?:(?:对了|另外|还有|顺便说一下|顺便说|顺便|此外|补充一下|再补充|哦|噢|嗯|好的|好)[，,：:\s]*)+"
)
_QUESTION_RE = re.compile(
    r"[?？]\s*$|[吗呢么][。.!！]?\s*$"
    r"|^(?:what|why|where|when|who|whom|whose|which|how|can (?:you|i|we)|could (?:you|i|we)"
    r"|would (?:you|it)|will (?:you|it|there)|do (?:you|i|we|they)|does|did"
    r"|is (?:it|there|this|that)|are (?:you|there|they|we)|should (?:i|we)|shall (?:i|we)"
    r"|may i|have you|has it)\b"
)
MONTHS = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_MONTHS_LOW = MONTHS.lower()
_TIME = (
    r"\d{4}[-/]\d{1,2}[-/]\d{1,2}|\d{4}年\d{1,2}月(?:\d{1,2}[日号])?|\d{1,2}月\d{1,2}[日号]"
    rf"|\b{_MONTHS_LOW} \d{{1,2}}(?:st|nd|rd|th)?\b"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTHS_LOW}"
    r"|\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b|\btomorrow\b|\btonight\b|\btoday\b"
    r"|\bnext (?:week|month|year)\b|\bend of (?:the )?(?:day|week|month|year)\b"
    r"|\b\d{1,2}(?::\d{2})? ?[ap]\.?m\b|\bnoon\b|\bmidnight\b"
    r"|(?:下|这|本|上)?(?:周|星期|礼拜)[一二三四五六日天末]|明天|后天|今天|今晚|明早|下周|下个月|月底|年底"
    r"|\d{1,2}[点時时](?:\d{1,2}分?|半)?"
)
TIME_RE = re.compile(_TIME)
COMMIT_RE = re.compile(
    r"\b(?:i'll|i will|i'm going to|i am going to|i promise|i can|we'll|we will|i shall"
    r"|you'll have|you will have|from me)\b"
    r"|我(?:们)?(?:会|将|保证|答应|一定|马上|尽快)?[^，。；！？]{0,12}?"
    r"(?:发|交|送|寄|带|上传|给|付|打电话|提交|回复|转账|汇)"
)
EN_TRAIL = frozenset(
    re.findall(
        r"\S+",
        "is are was were be been must should can could will would stay stays remain remains keep "
        "has have to need needs take takes cost costs last lasts spend it of with not do does "
        "shall may might always get set at for on about around approximately roughly equals "
        "actually ok okay so well now also new old current updated latest correct",
    )
)
_ZH_TRAIL_RE = re.compile(
    r"(?:是|为|要|得|必须|应该|控制在|定在|定于|在|改成|改为|调整为|调到|也|都|就|还|可以|能|会"
    r"|总共|一共|共|大概|大约|约|可能|最好|尽量|：|:)+$"
)
ZH_LEAD_RE = re.compile(
    r"^(?:其实|那么|那就|那|还是|我们|咱们|我|你|您|这次|另外|而且|但是|所以|最后|最终|嗯|好|算了"
    r"|我改主意了|决定)+"
)


def subject_key(text: str) -> str | None:
    """`text` as a subject: casefolded words, punctuation dropped, at most 40 characters."""
    cleaned = re.sub(r"[\s_]+", " ", re.sub(r"[^\w\s.+@-]", " ", text.casefold())).strip(" .-")
    return cleaned[:40] or None


def has_cjk(text: str) -> bool:
    return re.search(f"[{CJK}]", text) is not None


def strip_lead(text: str) -> str:
    """The sentence without a leading discourse marker ("By the way, ", "对了，")."""
    text = text.strip()
    lead = _LEAD_RE.match(ascii_lower(text))
    return (text[lead.end() :].strip() if lead else text) or text


def noun_before(prefix: str, words_kept: int = 1) -> str | None:
    """The head of the noun phrase ending `prefix` ("The total budget is" -> "budget"), keeping
    the last `words_kept` English words ("My order number is" -> "order number" with 2)."""
    part = re.split(r"[,，:：;；]", prefix.rstrip(" :：=#\"'-"))[-1]
    part = re.split(r"[$¥€£\d]", part)[0].strip()
    if has_cjk(part):
        part = ZH_LEAD_RE.sub("", _ZH_TRAIL_RE.sub("", part).removesuffix("的").split("的")[-1])
        return part[-6:] or None
    words = [w.casefold() for w in re.findall(r"[A-Za-z][\w'-]*", part)]
    words = [w for w in words if w not in EN_TRAIL and w not in ENGLISH_STOPWORDS]
    return " ".join(words[-words_kept:]) or None


def first_words(rest: str, limit: int = 3) -> str:
    rest = re.split(r"[,，。;；!！?？]", rest)[0]
    if has_cjk(rest):
        return re.sub(r"[了吧啊呢吗的\s]+$", "", rest.strip())[:8]
    stop = r"\b(?:for|in|at|on|because|since|as|instead|and|but|to|which|from|with)\b"
    return " ".join(terms(re.split(stop, rest, flags=_I)[0] or rest)[:limit])


def head_noun(phrase: str) -> str | None:
    """The head noun of an object phrase: its last English word without a plural s, or the last
    two characters after 的 ("aisle seats" -> "seat", "靠窗的座位" -> "座位")."""
    phrase = re.split(
        r"[,，。;；!！?？]|\b(?:please|if|when|because|so|and|but)\b", phrase, flags=_I
    )[0]
    if has_cjk(phrase):
        run = re.sub(r"[了吧啊呢的\s]+$", "", phrase.split("的")[-1].strip())
        return run[-2:] or None
    words = [w.casefold() for w in re.findall(r"[A-Za-z][\w'-]*", phrase)]
    words = [w for w in words if w not in ENGLISH_STOPWORDS and w not in EN_TRAIL]
    return singular(words[-1]) if words else None


def singular(word: str) -> str:
    if word.endswith(("sses", "xes", "ches", "shes", "uses")):
        return word[:-2]
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def is_question(text: str) -> bool:
    return _QUESTION_RE.search(ascii_lower(text).strip()) is not None


def sentences(text: str) -> list[str]:
    """Split on . ! ? ; 。！？；and newlines, keeping each sentence's own punctuation."""
    return [s.strip() for s in _SENTENCE_SPLIT_RE.split(text) if s and s.strip()]
