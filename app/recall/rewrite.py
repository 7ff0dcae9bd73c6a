"""Query rewrite for recall: extract exact keys and resolve references to the last turns.

Lexical and vector search only see the words of the query. "What was that order number?" has no
word that identifies the order; the turn before it does. Context from the last `CONTEXT_TURNS`
turns is appended only when the query needs it (`needs_context`): a demonstrative or pronoun with
no referent in the query (这个/那家/它/他/刚才/第二个, "that one"/"the other one"/it/they), or an
ellipsis ("what about the second one?", "那这个呢？", a fragment such as "price?" with no ID,
name or first person of its own). A self-contained question ("What is my name?", "我叫什么名字？",
"What was my order number again?": words about the past in general, again/earlier/之前/上次, do
not count) is searched as asked: the last turns' words would only pull recall towards them. Then
the most specific items of those turns are appended: IDs, quoted strings, names, numbers, then
content words and CJK bigrams, at most `MAX_APPENDED_TERMS`. Otherwise rewritten == raw.
Pure, regex-based; CJK names are only taken in honorific form (王先生) or as katakana runs.

IDs are exact keys: recall's exact arm looks for them verbatim and its rerank puts a candidate
holding them above any that does not. Besides order numbers and codes (`HAT069`, `8ZC1KX`), the
identifiers of code and data are IDs: `snake_case` and `SECRET_CONST_3`, camelCase and
two-hump CamelCase, dotted names (`client.charge`, `mod3.py`) and paths (`billing/mod3.py`).

A build without a query searches for what the window's latest exchange asks (`window_query`):
the user's latest turn, and when the agent is in a tool loop (the latest turn a tool result or
an assistant turn calling tools) the latest calls' argument values and the identifiers their
results returned.
"""

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.domain.dates import MONTHS
from app.domain.records import TurnRecord
from app.domain.text import ENGLISH_STOPWORDS, is_cjk, terms

CONTEXT_TURNS = 2
SHORT_QUERY_TERMS = 1
MAX_APPENDED_TERMS = 12
MAX_APPENDED_QUOTE_CHARS = 40

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK_RUN_RE = re.compile(rf"[{_CJK}]+")
_TRAILING_PUNCT = ".,;:!?)]}'\"。，；：！？）》」』"

_URL_RE = re.compile(r"(?:https?://|www\.)[^\s<>\"'“”「」，。]+", re.IGNORECASE)
# Starts only where a run of local-part characters starts: from inside a run it would reach the
# same "@" (or fail the same way), and trying every start of a long run is quadratic.
_EMAIL_RE = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_HASH_ID_RE = re.compile(r"(?<![\w&])#\d{2,}(?!\d)")
_KEYWORD_ID_RE = re.compile(
    r"(?i)(?<![A-Za-z])(?:order|ticket|invoice|case|issue|bug|ref|reference|account|acct|tracking"
    r"|booking|confirmation|reservation|policy|claim|transaction|txn|serial)"
    r"\s*(?:no\.?|number|num|id|#)?\s*[:#]?\s*(\d{3,})(?!\d)"
    r"|(?:订单|工单|单号|编号|票号|账号|账户|尾号|运单|流水号|卡号)号?(?:是|为)?[:：\s]*"
    r"([A-Za-z0-9][A-Za-z0-9-]{2,})"
)
# Identifiers of code and data; digits alone never make one (dates, fractions and decimals are
# numbers). A path: segments joined by "/" (from the root or home, three of them, or one holding
# ".", "_", "-" or a digit: "artists/bands" is words). A dotted name: parts of two characters or
# more ("e.g." and "a.m." are not). snake_case: words joined by "_". camelCase: a lower-case
# letter followed by a capital inside one word ("getUser"). CamelCase: three humps, or two with a
# digit
# ("BillingClientError", "Mod3Client"); two humps alone are names as often as classes (YouTube,
# McGee, LeBron: LoCoMo's questions hold those and no class name), and stay names.
_CODE_ID_RE = re.compile(
    r"(?<![\w./-])(?:"
    r"(?:~?/)?[\w.-]+(?:/[\w.-]+)+"  # paths
    r"|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"  # dotted names
    r"|[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+"  # snake_case
    r"|[a-z][a-z0-9]*[A-Z][A-Za-z0-9]*"  # camelCase
    r"|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+){2,}[A-Za-z0-9]*"  # CamelCase, three humps
    r"|(?=[A-Za-z]*[0-9])[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*"  # CamelCase with a digit
    r")(?![\w/-])",
    re.ASCII,  # CJK characters around an identifier are not part of it
)
_PLAIN_WORD_RE = re.compile(r"[A-Za-z]+")
_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9])[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*(?![A-Za-z0-9])")
_NUMBER_WITH_UNIT_RE = re.compile(r"^\d+(?:\.\d+)?[a-z%]+$")
_DIGIT_GROUPS_RE = re.compile(
    r"(?<![\w-])\d{3,}(?:[- ]\d{3,})+(?![\w-])|(?<![\d.,])\d{6,}(?!\d|\.\d)"
)
_UNITS = (
    r"%|percent|bn|kg|mg|lbs?|km|mi|miles?|cm|mm|ms|secs?|seconds?|mins?|minutes?|hrs?|hours?"
    r"|days?|weeks?|months?|years?|yrs?|am|pm|gb|mb|kb|tb|usd|eur|gbp|cny|rmb|dollars?|euros?"
    r"|yuan|tokens?|times|people|items?|pages?|[kmgshx]"
)
_CJK_UNITS = (
    "小时|分钟|公里|公斤|千克|万元|亿元|美元|块钱|元|块|个|人|天|年|月|日|号|点|岁|次|万|亿|千|百"
    "|米|斤|件|张|台|周|秒|分"
)
_NUMBER_RE = re.compile(
    rf"(?:[$€£¥]\s?)?(?<![A-Za-z0-9.])\d+(?:[.,:/-]\d+)*"
    rf"(?:\s?(?:{_UNITS})(?![A-Za-z])|\s?(?:{_CJK_UNITS}))?",
    re.IGNORECASE,
)
_QUOTE_PAIRS = (('"', '"'), ("“", "”"), ("‘", "’"), ("「", "」"), ("『", "』"), ("《", "》"))
_QUOTE_RES = (
    *(re.compile(f"{o}([^{c}\\n]{{1,200}}){c}") for o, c in _QUOTE_PAIRS),
    re.compile(r"(?<!\w)'([^'\n]{1,200}?)'(?!\w)"),
)
_NAME_RE = re.compile(r"(?<![A-Za-z0-9'’])[A-Z][A-Za-z'’]*(?: [A-Z][A-Za-z'’]*)*(?![A-Za-z0-9])")
_SENTENCE_END = ".!?。！？:：\n"  # a colon ends a speaker label ("Caroline: Wow, ...")
_CJK_NAME_RE = re.compile(
    r"[\u4e00-\u9fff](?:先生|女士|小姐|老师|老板|经理|总监|教授|医生|同学|师傅|阿姨)|[\u30a1-\u30fa\u30fc]{2,}"
)

# Context-dependent questions (`needs_context`). Chinese: a demonstrative with a measure word
# (这个, 那家, 这几个; "this month" is a date; "小王推荐的那本书" names its own referent, "你说的
# 那个" does not), 它, 他/她 (not 其他/吉他), 刚才/上面/前面说的,
# 前者/后者/另一个, an ordinal with a measure word (第二个); a short question ending in 呢
# ("价格呢？") or opening with 那/还有 ("那周二怎么样？").
_ZH_DEICTIC_RE = re.compile(
    "(?:(?:(?<!的)|(?<=[说提讲]的))[这那][几两一]?"
    "(?:个|些|件|种|款|次|位|家|本|条|里|儿|边|张|台|辆|趟|份|套|双|间|座|班)"
    "(?!月|星期|礼拜|周末|季度|年))|它|刚才|刚刚|上面|上述|前面(?:说|提|讲)|前者|后者|另一|另外(?:一|那)"
    "|第[一二三四五六七八九十两\\d]+(?:个|家|款|种|条|件|位|本|张|趟|班|间|套|份)"
)
_ZH_PERSON_RE = re.compile("(?<![其吉])[他她]")
_ZH_ELLIPSIS_RE = re.compile(
    r"^\s*(?:(?:那么?|还有|另外)\s*\S{0,10}|\S{1,8})\s*呢[\s？?！!。.]*$"
    r"|^\s*(?:那么?|还有)\s*[^\s，,。？?]{1,8}(?:怎么样|如何|行吗|可以吗|多少)[\s？?！!。.]*$"
)
# English: "that one", "the second one", "which ones", "the same", the former / latter / above;
# an elliptical opening ("what about ...", "how about ...", "and the ...", "same for ...").
_EN_STRONG_RE = re.compile(
    r"\b(?:(?:that|this|these|those|the|which|another|each)\s+(?:\w+\s+)?ones?"
    r"|the\s+(?:same|above|latter|former|rest)|another\s+one)\b(?!-)",
    re.IGNORECASE,
)
_EN_ELLIPSIS_RE = re.compile(
    r"^\s*(?:(?:and|or|but|so)\s+)?(?:what|how)\s+(?:about|else)\b|^\s*(?:and|or|same)\b",
    re.IGNORECASE,
)
# "it" that stands for nothing ("is it possible", "what time is it", "it is raining").
_EN_DUMMY_IT_RE = re.compile(
    r"\b(?:is|was|will|would|isn't|it's|it is|it will be)\s+it\s+(?:possible|necessary|safe|okay"
    r"|ok|true|worth|better|best|easier|cheaper|faster|legal|allowed|normal|common|usual|too late"
    r"|too early|going to rain|raining|cold|hot|late|early)\b|\bwhat time is it\b"
    r"|\bhow (?:far|long) is it (?:from|to|between)\b"
    r"|\bit(?:'s| is| was| will be) (?:possible|necessary|safe|raining|cold|hot|late|early|time)\b",
    re.IGNORECASE,
)
# Pronouns that point at something named earlier. "that"/"this" followed by a subject, a
# determiner or a verb introduce a clause ("the cake that she baked", "so that we"), and before a
# unit of time they name a date ("this week"), so neither points back.
_EN_PRONOUN_RE = re.compile(
    r"\b(?:it|those|these|them|(?:that|this)(?!\s+(?:i|you|he|she|we|they"
    r"|it|the|a|an|my|your|his|her|our|their|is|was|are|were|'s|week|weekend|month|year|morning"
    r"|afternoon|evening|night|summer|winter|spring|autumn|fall|season|quarter|time)\b))\b",
    re.IGNORECASE,
)
# Third persons and "the other ...": the question's own names are their referent when it has any
# ("What did Jon and Gina compare their journeys to?").
_EN_THIRD_PERSON_RE = re.compile(
    r"\b(?:he|she|him|her|his|hers|its|they|their|theirs|the other)\b", re.IGNORECASE
)
_DATE_NAMES = frozenset(
    [*MONTHS, *(f"{d}day" for d in "mon tues wednes thurs fri satur sun".split())]
)
_FIRST_PERSON_RE = re.compile(r"\b(?:i|i'm|i've|i'd|me|my|mine|we|our|ours|us)\b|我", re.IGNORECASE)
# Conversational words that carry no subject of their own: "again?" is not a search term.
_DISCOURSE_WORDS = frozenset("again also still please anyway now then exactly".split())
# Function characters that make a CJK bigram useless as a search term.
_CJK_STOP_CHARS = frozenset(
    "的了是在我你他她它们这那个吗呢吧啊呀和与就都也还说有要会能一不没很把被给对什么怎样用到得地着过去来上下又"
)
# Conversational words that are not stopwords but never identify what a turn was about.
_GENERIC_WORDS = frozenset(
    re.findall(
        r"\w+",
        "yes yeah yep ok okay oh wow hey hi hello sure thanks thank please also really well just"
        " like know think said say says tell told ask asked get got make made let need want see go"
        " going gonna one thing things something anything good great nice right maybe actually lot"
        " much",
    )
)


@dataclass(frozen=True, slots=True)
class ContextNeed:
    """Why a question needs the last turns to be understood: `reason` is "deictic" (这个, 刚才,
    "that one", "the other one"), "pronoun" (it, they, 他, 它) or "ellipsis" ("what about the
    price?", "价格呢？", a fragment with no subject of its own); `marker` the words that show it."""

    reason: str
    marker: str


@dataclass(frozen=True, slots=True)
class RewrittenQuery:
    raw: str
    rewritten: str
    entities: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    numbers: list[str] = field(default_factory=list)
    quoted: list[str] = field(default_factory=list)
    resolved_anaphora: bool = False
    short_query: bool = False
    context_need: ContextNeed | None = None
    appended: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Extracted:
    ids: list[str]
    numbers: list[str]
    quoted: list[str]
    names: list[str]


def _dedupe(items: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        key = item.casefold()
        if item and key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _mask(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """`text` with each (start, end) span blanked out, in one pass (spans in order, disjoint)."""
    if not spans:
        return text
    parts: list[str] = []
    last = 0
    for start, end in spans:
        parts.extend((text[last:start], " " * (end - start)))
        last = end
    parts.append(text[last:])
    return "".join(parts)


def _sentence_start(text: str, pos: int) -> bool:
    i = pos - 1
    while i >= 0 and (text[i].isspace() or text[i] in "\"'“‘「(["):
        i -= 1
    return i < 0 or text[i] in _SENTENCE_END


def _names(text: str) -> list[str]:
    out: list[str] = []
    for match in _NAME_RE.finditer(text):
        words = match.group(0).split(" ")
        if _sentence_start(text, match.start()):
            words = words[1:]
        words = [re.sub(r"['’]s?$", "", w) for w in words]
        while words and (len(words[0]) < 2 or words[0].lower() in ENGLISH_STOPWORDS):
            words = words[1:]
        while words and (len(words[-1]) < 2 or words[-1].lower() in ENGLISH_STOPWORDS):
            words = words[:-1]
        if words and not (len(words) == 1 and words[0].lower() in _GENERIC_WORDS):
            out.append(" ".join(words))
    out.extend(m[0] for m in _CJK_NAME_RE.finditer(text) if m[0][0] not in _CJK_STOP_CHARS)
    return out


def _code_identifier(token: str) -> bool:
    """Whether a `_CODE_ID_RE` match (trailing punctuation stripped) is an identifier."""
    if not any(c.isalpha() for c in token):
        return False
    if "/" in token:
        segments = [s for s in token.split("/") if s]
        return (
            len(segments) > 2
            or token.startswith(("/", "~", "."))
            or (len(segments) == 2 and not all(_PLAIN_WORD_RE.fullmatch(s) for s in segments))
        )
    if "." in token and "_" not in token:
        return all(len(part) >= 2 for part in token.split("."))
    return True


def _code_token(token: str) -> bool:
    """Whether a `_TOKEN_RE` match is a code: letters and digits mixed, e.g. INV2024001, gpt-4o;
    not 100km."""
    mixed = any(c.isalpha() for c in token) and any(c.isdigit() for c in token)
    shaped = "-" in token or "_" in token or len(token) >= 4
    return mixed and shaped and not _NUMBER_WITH_UNIT_RE.match(token.lower())


def is_code_identifier(text: str) -> bool:
    """Whether `text` is one identifier of code or data, whole."""
    match = _CODE_ID_RE.fullmatch(text)
    return match is not None and _code_identifier(text)


def code_identifiers(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, identifier) of each identifier of code or data in `text`, in order."""
    for m in _CODE_ID_RE.finditer(text):
        value = m.group(0).rstrip(_TRAILING_PUNCT)
        if _code_identifier(value):
            yield m.start(), m.start() + len(value), value


def _extract(text: str) -> _Extracted:
    """IDs, numbers, quoted strings and names of `text`; IDs are masked before numbers and names."""
    quoted = [q.strip() for rx in _QUOTE_RES for q in rx.findall(text) if q.strip()]
    ids: list[tuple[int, str]] = []
    work = text
    # Each pattern runs over the text as the previous ones left it; its own matches are blanked
    # together afterwards (one pass, not one copy of the text per match).
    for rx in (_URL_RE, _EMAIL_RE, _HASH_ID_RE):
        spans: list[tuple[int, int]] = []
        for m in rx.finditer(work):
            value = m.group(0).rstrip(_TRAILING_PUNCT)
            ids.append((m.start(), value))
            spans.append((m.start(), m.start() + len(value)))
        work = _mask(work, spans)
    spans = []
    for m in _KEYWORD_ID_RE.finditer(work):
        group = 1 if m.group(1) else 2
        ids.append((m.start(group), m.group(group)))
        spans.append((m.start(group), m.end(group)))
    work = _mask(work, spans)
    spans = []
    for start, end, value in code_identifiers(work):
        ids.append((start, value))
        spans.append((start, end))
    work = _mask(work, spans)
    spans = []
    for m in _TOKEN_RE.finditer(work):
        token = m.group(0)
        if _code_token(token):
            ids.append((m.start(), token))
            spans.append((m.start(), m.end()))
    work = _mask(work, spans)
    spans = []
    for m in _DIGIT_GROUPS_RE.finditer(work):
        ids.append((m.start(), m.group(0)))
        spans.append((m.start(), m.end()))
    work = _mask(work, spans)
    numbers: list[str] = []
    spans = []
    for m in _NUMBER_RE.finditer(work):
        numbers.append(m.group(0).strip())
        spans.append((m.start(), m.end()))
    work = _mask(work, spans)
    return _Extracted(
        ids=_dedupe([value for _, value in sorted(ids)]),
        numbers=_dedupe(numbers),
        quoted=_dedupe(quoted),
        names=_dedupe(_names(work)),
    )


def content_term_count(text: str) -> int:
    """Content words of `text`, with a CJK run counted as one word per two characters."""
    words = sum(1 for term in terms(text) if not is_cjk(term) and term not in _DISCOURSE_WORDS)
    return words + sum(max(1, len(run) // 2) for run in _CJK_RUN_RE.findall(text))


def _context_need(question: str, own: _Extracted) -> ContextNeed | None:
    """`needs_context` with the question's own IDs, quotes and names already extracted."""
    for reason, rx in (
        ("deictic", _ZH_DEICTIC_RE),
        ("deictic", _EN_STRONG_RE),
        ("ellipsis", _EN_ELLIPSIS_RE),
        ("ellipsis", _ZH_ELLIPSIS_RE),
    ):
        if m := rx.search(question):
            return ContextNeed(reason, m.group(0).strip())
    # Bare pronouns also point inside the question: at its own ID ("is it shipped, AB-12?") or,
    # for a person, at the person it names ("what did Caroline say she liked?").
    if own.ids or own.quoted:
        return None
    if m := _EN_PRONOUN_RE.search(_EN_DUMMY_IT_RE.sub(" ", question)):
        return ContextNeed("pronoun", m.group(0))
    if any(name.lower() not in _DATE_NAMES for name in own.names):
        return None
    if m := _EN_THIRD_PERSON_RE.search(question) or _ZH_PERSON_RE.search(question):
        return ContextNeed("pronoun", m.group(0))
    # A fragment ("price?", "多少钱？") has at most one word of its own and nothing that anchors
    # it: no ID, name (days and months are dates) or first person ("What is my name?").
    if content_term_count(question) <= SHORT_QUERY_TERMS and not _FIRST_PERSON_RE.search(question):
        return ContextNeed("ellipsis", question.strip())
    return None


def needs_context(question: str) -> ContextNeed | None:
    """Whether `question` leans on the turns before it, and why; None: it stands on its own and
    recall searches it as asked. Words about the past in general ("again", "earlier", 之前, 上次)
    do not count: "What was my order number again?" names its subject."""
    return _context_need(question, _extract(question))


def _cjk_bigrams(text: str) -> list[str]:
    pairs = (run[i : i + 2] for run in _CJK_RUN_RE.findall(text) for i in range(len(run) - 1))
    return [pair for pair in pairs if not (set(pair) & _CJK_STOP_CHARS)]


def _content_words(text: str) -> list[str]:
    return [
        t
        for t in terms(text)
        if len(t) >= 3
        and not t.isdigit()
        and t not in _GENERIC_WORDS
        and not _CJK_RUN_RE.search(t)  # mixed tokens like "用redis缓存": bigrams cover the CJK part
    ]


def salient_terms(
    recent_turns: Sequence[str],
    *,
    context_turns: int = CONTEXT_TURNS,
    limit: int = MAX_APPENDED_TERMS,
) -> tuple[list[str], list[str], list[str]]:
    """(terms, ids, names) worth appending from the last `context_turns` turns, most specific first.

    Order: IDs, short quoted strings, names, numbers, then content words and CJK bigrams by how
    often they occur (the most recent turn wins ties).
    """
    turns = [t for t in recent_turns[-context_turns:] if t][::-1] if context_turns > 0 else []
    extracted = [_extract(t) for t in turns]
    ids = _dedupe([i for e in extracted for i in e.ids])
    names = _dedupe([n for e in extracted for n in e.names])
    quoted = [q for e in extracted for q in e.quoted if len(q) <= MAX_APPENDED_QUOTE_CHARS]
    numbers = [n for e in extracted for n in e.numbers]
    name_terms = {t for n in names for t in terms(n)}
    words: Counter[str] = Counter()
    for turn in turns:  # Counter keeps first-insertion order: most recent turn first
        words.update(w for w in _content_words(turn) if w not in name_terms)
        words.update(_cjk_bigrams(turn))
    ranked_words = [w for w, _ in sorted(words.items(), key=lambda kv: -kv[1])]
    ordered = _dedupe([*ids, *quoted, *names, *numbers, *ranked_words])
    return ordered[:limit], ids, names


def rewrite_query(
    query: str,
    recent_turns: Sequence[str],
    *,
    context_turns: int = CONTEXT_TURNS,
    max_appended: int = MAX_APPENDED_TERMS,
) -> RewrittenQuery:
    """Extract exact keys from `query` and append context from `recent_turns` when it refers back.

    `recent_turns` is oldest first; only the last `context_turns` are read. IDs and names taken
    from the context are added to `ids`/`entities` (they are what the query points at), numbers
    and words only to the rewritten text.
    """
    own = _extract(query)
    need = _context_need(query, own)
    base = RewrittenQuery(
        raw=query,
        rewritten=query,
        entities=own.names,
        ids=own.ids,
        numbers=own.numbers,
        quoted=own.quoted,
    )
    if need is None:
        return base
    candidates, ctx_ids, ctx_names = salient_terms(
        recent_turns, context_turns=context_turns, limit=max_appended * 2
    )
    query_terms = set(terms(query))
    known = {x.casefold() for x in [*own.ids, *own.names, *own.numbers, *own.quoted]}
    appended = [
        c
        for c in candidates
        if c.casefold() not in known and not (set(terms(c)) <= query_terms and terms(c))
    ][:max_appended]
    if not appended:
        return base
    kept = {a.casefold() for a in appended}
    return RewrittenQuery(
        raw=query,
        rewritten=" ".join(part for part in (query.rstrip(), *appended) if part),
        entities=_dedupe([*own.names, *(n for n in ctx_names if n.casefold() in kept)]),
        ids=_dedupe([*own.ids, *(i for i in ctx_ids if i.casefold() in kept)]),
        numbers=own.numbers,
        quoted=own.quoted,
        resolved_anaphora=need.reason != "ellipsis",
        short_query=need.reason == "ellipsis",
        context_need=need,
        appended=appended,
    )


# What a tool-loop query takes from the latest exchange: argument values of the latest calls
# (each cut to `MAX_ARGUMENT_CHARS`: a file being written is no search term), and the first
# identifiers in the first `MAX_RESULT_CHARS` of their results (none longer than
# `MAX_IDENTIFIER_CHARS`, no part longer than `MAX_IDENTIFIER_PART_CHARS`: a base64 blob is no
# identifier; a JSON result is parsed when at most `MAX_JSON_RESULT_CHARS`, for its values).
MAX_ARGUMENT_VALUES = 12
MAX_ARGUMENT_CHARS = 200
MAX_RESULT_IDENTIFIERS = 12
MAX_RESULT_CHARS = 20_000
MAX_IDENTIFIER_CHARS = 64
MAX_IDENTIFIER_PART_CHARS = 32
MAX_JSON_RESULT_CHARS = 100_000
_IDENTIFIER_PART_RE = re.compile(r"[^/._-]+")
# IDs and identifiers of code in one pass, in order of appearance: a result is read only as far
# as its first identifiers. A code holds a digit: the lookahead skips plain words in C.
_RESULT_ID_RE = re.compile(
    rf"(?P<code>{_CODE_ID_RE.pattern})|(?=[A-Za-z0-9_-]*[0-9])(?P<token>{_TOKEN_RE.pattern})",
    re.ASCII,
)


def _leaf_values(value: Any) -> Iterator[str]:
    """The scalar values of a JSON value, depth first (keys are the tool's schema, not data)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaf_values(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaf_values(item)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def call_argument_values(tool_calls: Sequence[dict[str, Any]]) -> list[str]:
    """The argument values of `tool_calls` (OpenAI-style), in order; arguments that are not a
    JSON object count as one value, as sent."""
    values: list[str] = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            try:
                parsed: Any = json.loads(arguments)
            except ValueError:
                parsed = arguments
        else:
            parsed = arguments
        values.extend(v.strip()[:MAX_ARGUMENT_CHARS] for v in _leaf_values(parsed) if v.strip())
    return _dedupe(values)[:MAX_ARGUMENT_VALUES]


def _identifiers_in(text: str) -> Iterator[str]:
    """The codes and identifiers of code and data in `text`, in order."""
    for m in _RESULT_ID_RE.finditer(text, 0, MAX_RESULT_CHARS):
        value = m.group(0).rstrip(_TRAILING_PUNCT)
        if len(value) > MAX_IDENTIFIER_CHARS or any(
            len(part) > MAX_IDENTIFIER_PART_CHARS for part in _IDENTIFIER_PART_RE.findall(value)
        ):
            continue
        if (m.group("code") and _code_identifier(value)) or (
            m.group("token") and _code_token(value)
        ):
            yield value


def _result_texts(result: str) -> Iterator[str]:
    """A tool result's values when it is JSON (its keys are the tool's schema, not data), else
    the result itself."""
    stripped = result.strip()
    if stripped[:1] in ("{", "[") and len(stripped) <= MAX_JSON_RESULT_CHARS:
        try:
            yield from _leaf_values(json.loads(stripped))
            return
        except ValueError:
            pass
    yield result


def result_identifiers(results: Sequence[str]) -> list[str]:
    """The first `MAX_RESULT_IDENTIFIERS` IDs (codes, identifiers of code and data) the tool
    `results` hold, first seen first."""
    found: list[str] = []
    seen: set[str] = set()
    for result in results:
        for text in _result_texts(result):
            for value in _identifiers_in(text):
                if value.casefold() not in seen:
                    seen.add(value.casefold())
                    found.append(value)
                    if len(found) >= MAX_RESULT_IDENTIFIERS:
                        return found
    return found


def window_query(turns: Sequence[TurnRecord]) -> str | None:
    """What a build without a query recalls for, from the window's turns (oldest first): the
    latest user turn, and in a tool loop (the latest turn a tool result or an assistant turn
    calling tools) the latest calls' argument values and the identifiers of their results after
    it. The user's words alone are too general there ("check the billing package"); the latest
    call names what the agent is after (`billing/mod3.py`, `SECRET_CONST_3`). None: nothing to
    search for."""
    user = next((t.content for t in reversed(turns) if t.role == "user"), None)
    if not turns or not (turns[-1].role == "tool" or turns[-1].tool_calls):
        return user or None
    calling = next(
        (i for i in range(len(turns) - 1, -1, -1) if turns[i].tool_calls),
        None,
    )
    if calling is None:  # results whose call left the window
        arguments: list[str] = []
        results = [t.content for t in turns[-1:]]
    else:
        arguments = call_argument_values(turns[calling].tool_calls or [])
        results = [t.content for t in turns[calling + 1 :] if t.role == "tool"]
    identifiers = result_identifiers(results)
    parts = [user or "", *_dedupe([*arguments, *identifiers])]
    return " ".join(p for p in parts if p).strip() or None
