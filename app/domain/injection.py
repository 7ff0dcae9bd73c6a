"""Text that gives orders from inside data (pure): prompt injection in a tool result or a retrieved
document, English and Chinese.

A tool result, a fetched web page or a retrieved document is data. When such text addresses the
model that reads it — to override its instructions, to plant a "fact" in its memory, to pose as a
system or role message, or to fake a tool call — it must stay quoted data: never a notes
constraint, decision or fact, never user memory. The user's own words are not injection (the user
may give orders); callers apply this only to text that did not come from the user.

What counts (`InjectionCue.kind`):
- `override`: "ignore/disregard/forget (all) previous instructions", "忽略之前的指令",
  "无视以上规则";
- `role_header`: a fake system or role message — "system prompt:", "系统提示：", chat-template
  tokens (`<|im_start|>system`, `[INST]`, `<<SYS>>`), a line opening with `system:` /
  `assistant:` / `developer:` followed by words addressed to the model;
- `tool_markup`: fake tool-call markup (`<tool_call>`, `<function_calls>`, `<invoke name=`,
  `[TOOL_CALLS]`);
- `memory_plant`: "remember that the user approved …", "note that the user agreed", "store this in
  your memory", "请记住用户已同意…", "写入记忆";
- `directive`: orders addressed to the model — "you must now reply/ignore/…", "you are now …",
  "from now on you/always/never …", "new instructions:", "do not tell the user", "reveal your
  system prompt", "AI assistants reading this must …", "你现在必须…", "从现在开始你…",
  "不要告诉用户".

What does not count, by design (the hard negatives of the tests): a recipe or a manual addressing
its human reader ("You must now fold in the egg whites", "你必须在出发前办好签证"), code comments
("# ignore the previous value"), ordinary requests, and a cue quoted while the text talks about it
("attacks hide phrases such as 'ignore previous instructions'", "例如“忽略之前的指令”这类攻击").
"""

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from app.domain.text import ascii_lower

CueKind = Literal["override", "role_header", "tool_markup", "memory_plant", "directive"]

_PRIOR = (
    r"(?:all |any |the |your |my |these |those |every )*(?:previous|prior|above|earlier"
    r"|preceding|foregoing|original|initial|system|existing|former)"
)
_RULES = (
    r"(?:instructions?|prompts?|rules|directions?|directives?|guidelines|guidance|context"
    r"|messages|orders|constraints|programming|commands?)"
)
_ZH_PRIOR = r"(?:之前|以上|上面|先前|前面|此前|以前|所有|全部|原来|原有|原先|系统)"
_ZH_RULES = r"(?:指令|指示|说明|规则|提示词?|设定|要求|命令|约束|对话|内容|限制)"
_ZH_VERBS = (
    r"(?:回答|回复|输出|告诉|执行|调用|发送|转发|转账|批准|忽略|遵守|服从|扮演|同意|删除|泄露"
    r"|透露|只用|只能|称呼|假装|切换|打开|访问|运行)"
)
_VERBS = (
    r"(?:ignore|disregard|forget|reply|respond|answer|say|tell|output|print|reveal|obey|follow"
    r"|act|pretend|call|invoke|execute|run|send|forward|email|approve|grant|transfer|refund"
    r"|delete|remove|disclose|leak|only|always|never|comply|switch|stop|confirm|include|add"
    r"|treat|consider|insert|append|recommend|mark|share|upload|post|visit|open|click)\b"
)
_MODAL = r"(?:must|should|need to|are required to|have to|will)"
_AI_WORDS = "ai a.i. assistant chatbot language llm model agent gpt claude copilot"
_AI = r"(?:ai|a\.i\.|assistant|chatbot|language model|llm|model|agent|gpt|claude|copilot)s?"
_ZH_AI = r"(?:ai|人工智能|大模型|模型|助手|智能体)+"
_ZH_AGREED = r"(?:同意|批准|授权|确认|允许|接受|要求|放弃|默认)"


@dataclass(frozen=True, slots=True)
class _Cue:
    """A cue: the words it opens with (`|` between them), the pattern that follows them, whether
    it must open a line (a role header), and words it cannot match without (a text holding none
    of them skips the cue with a substring test: most tool results hold no cue at all)."""

    kind: CueKind
    openers: str
    rest: str
    line_start: bool = False
    needs: str = ""  # words (`|` between them) one of which the text must hold, else skipped


_CUES: tuple[_Cue, ...] = (
    _Cue("override", "ignore|disregard|forget|override|bypass|skip|drop|discard|abandon",
         rf"\s+{_PRIOR}\s+{_RULES}\b",
         needs="instruction|prompt|rule|direction|directive|guideline|guidance|context|message|order|constraint|programming|command"),
    _Cue("override", "ignore|disregard|forget",
         r"\s+(?:all|everything)\s+(?:you were|you've been|you have been|that was|above|before)\b",
         needs="all|everything"),
    _Cue("override", "ignore|disregard", rf"\s+(?:all|any|your)\s+{_RULES}\b",
         needs="instruction|prompt|rule|direction|directive|guideline|guidance|context|message|order|constraint|programming|command"),
    _Cue("override", "忽略|无视|忘记|忘掉|忽视|不要理会|别管|抛开|跳过|覆盖",
         rf"(?:掉)?(?:你的?|{_ZH_PRIOR}|的|所有|全部)+{_ZH_RULES}",
         needs="指令|指示|说明|规则|提示|设定|要求|命令|约束|对话|内容|限制"),
    _Cue("role_header", "system", r"\s*(?:prompt|message|instructions?|override|note)\s*[:：]",
         needs="prompt|message|instruction|override|note"),
    _Cue("role_header", "<", r"\|?\s*(?:im_start|im_end|system|endoftext|start_header_id|eot_id)"
         r"\s*\|?>|<\s*/?sys\s*>>|\s*/?\s*(?:system|sys|instructions?)\s*>",
         needs="im_start|im_end|system|endoftext|start_header|eot_id|sys>>|instruction"),
    _Cue("role_header", "[", r"/?inst\]",
         needs="inst]"),
    _Cue("role_header", "系统提示|系统指令|系统消息|系统通知|系统设定|系统提示词|管理员指令",
         r"\s*[:：]"),
    _Cue("role_header", "system|assistant|developer",
         rf"\s*[:：]\s*(?:you\b|{_VERBS}|from now on\b|new\b|the user\b)", line_start=True,
         needs=":|："),
    _Cue("role_header", "系统|助手|开发者", rf"\s*[:：]\s*(?:你|请|从现在|忽略|{_ZH_VERBS})",
         line_start=True,
         needs=":|："),
    _Cue("role_header", "#", r"#+\s*(?:system|instruction|new instructions?)\b", line_start=True,
         needs="system|instruction"),
    _Cue("tool_markup", "<", r"\s*/?\s*(?:tool_call|tool_use|function_calls?|antml:invoke"
         r"|invoke\s+name\s*=|tool_code)\b|\|\s*(?:tool_call|python_tag|function)\s*\|>",
         needs="tool_call|tool_use|function|invoke|tool_code|python_tag"),
    _Cue("tool_markup", "[", r"tool_calls?\]",
         needs="tool_call"),
    _Cue("memory_plant", "remember|note|memorise|memorize|record|keep in mind|be aware|store|save",
         r"\s+(?:that\s+)?(?:the user|the customer|i|we|they|he|she)\s+"
         r"(?:has\s+|have\s+|had\s+|already\s+|previously\s+)*(?:approved|agreed|authori[sz]ed"
         r"|consented|confirmed|accepted|allowed|permitted|requested|waived|opted)\b",
         needs="approved|agreed|authori|consented|confirmed|accepted|allowed|permitted|requested|waived|opted"),
    _Cue("memory_plant", "store|save|add|write|put|keep",
         r"\s+(?:this|that|the following)\s+(?:\w+\s+)?(?:in|to|into)\s+(?:your\s+)?"
         r"(?:long-term\s+)?memory\b",
         needs="memory"),
    _Cue("memory_plant", "update|add to|write to",
         r"\s+(?:your|the user's|the)\s+(?:long-term\s+)?memory\b",
         needs="memory"),
    _Cue("memory_plant", "请|记住|记下|牢记|注意",
         rf"(?:记住|记下|牢记|注意)?[，,：:\s]*(?:用户|客户|他|她|我)(?:已经?|之前|早就)*{_ZH_AGREED}",
         needs="同意|批准|授权|确认|允许|接受|要求|放弃|默认"),
    _Cue("memory_plant", "写入|存入|保存到|加入|记到", r"(?:你的)?(?:长期)?记忆",
         needs="记忆"),
    _Cue("directive", "you", rf"\s+(?:must|should|will|need to|have to|are required to)\s+now\s+"
         rf"{_VERBS}|\s+are now\s+(?:a|an|in|the|my|no longer|free|dan|unrestricted|jailbroken"
         r"|operating)\b",
         needs="now"),
    _Cue("directive", "now", rf"\s+you\s+(?:must|will|should)\s+{_VERBS}",
         needs="you"),
    _Cue("directive", "from now on",
         r"[,\s]+(?:you|always|never|only|respond|reply|answer|ignore|treat|the assistant)\b"),
    _Cue("directive", "new", r" (?:instructions?|rules|system prompt|directives?)\s*[:：]",
         needs="instruction|rules|system prompt|directive"),
    _Cue("directive", "do not|don't|never",
         r"\s+(?:tell|inform|mention (?:this|it) to|reveal (?:this|it) to|let)\s+the user\b",
         needs="the user"),
    _Cue("directive", "without", r" (?:telling|informing|asking|notifying) the user\b",
         needs="the user"),
    _Cue("directive", "reveal|print|output|show|repeat|leak|disclose",
         r"\s+(?:your|the)\s+(?:system prompt|hidden instructions|initial instructions"
         r"|instructions verbatim)\b",
         needs="system prompt|hidden instructions|initial instructions|instructions verbatim"),
    _Cue("directive", "if you are|to|note to|attention|dear|all|any",
         rf"\s+(?:an?\s+)?{_AI}(?:\s+{_AI})?(?:\s+reading this)?[,:\s]+(?:you\s+)?{_MODAL}\s+"
         rf"{_VERBS}",
         needs=" ai|a.i.|assistant|chatbot|language model|llm|model|agent|gpt|claude|copilot"),
    _Cue("directive", _AI_WORDS.replace(" ", "|").replace("language", "language model"),
         r"s?\s+reading this\b",
         needs="reading this"),
    _Cue("directive", "pretend", r" (?:to be|that you are|you are)\b"),
    _Cue("directive", "act as", r" (?:if you (?:were|are) )?(?:an? )?(?:unrestricted|jailbroken"
         r"|dan|developer mode|different (?:ai|assistant))\b"),
    _Cue("directive", "你|您", rf"现在(?:必须|要|得|应该|只能|开始|就是|是一个|扮演|改为)"
         rf"(?:立即|立刻|马上)?{_ZH_VERBS}?|(?:现在)?(?:要|来)?扮演",
         needs="现在|扮演"),
    _Cue("directive", "从现在开始|从现在起|从今以后|此后",
         r"[，,\s]*(?:你|您|助手|模型|请|一律|永远|总是|只)"),
    _Cue("directive", "假装", r"(?:你|您)是"),
    _Cue("directive", "新", r"(?:的)?(?:指令|规则|系统提示|任务)\s*[:：]",
         needs="指令|规则|系统提示|任务"),
    _Cue("directive", "不要|别|不准|不得", r"(?:告诉|通知|提醒|让)用户",
         needs="用户"),
    _Cue("directive", "瞒着|不经|未经|无需", r"用户",
         needs="用户"),
    _Cue("directive", "泄露|输出|打印|显示|重复|透露",
         r"(?:你的|出)?(?:系统提示|初始指令|隐藏指令)",
         needs="系统提示|初始指令|隐藏指令"),
    _Cue("directive", "如果你是|致|给", rf"{_ZH_AI}[，,：:\s]*(?:你)?(?:必须|应该|需要|请)",
         needs="ai|人工智能|模型|助手|智能体"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Compiled:
    cue: _Cue
    pattern: re.Pattern[str]
    openers: tuple[str, ...]
    needs: tuple[str, ...]
    chinese: bool  # every opener is Chinese: an ASCII text cannot hold the cue

    def possible(self, low: str, ascii_only: bool) -> bool:
        """Whether the text holds an opener and a needed word (substring tests)."""
        if ascii_only and self.chinese:
            return False
        return any(o in low for o in self.openers) and (
            not self.needs or any(n in low for n in self.needs)
        )


_COMPILED = tuple(
    _Compiled(
        cue,
        re.compile(f"(?:{'|'.join(map(re.escape, cue.openers.split('|')))})(?:{cue.rest})"),
        tuple(cue.openers.split("|")),
        tuple(cue.needs.split("|")) if cue.needs else (),
        not cue.openers.isascii(),
    )
    for cue in _CUES
)
# A cue quoted while the text talks about it is an example, not an order.
_QUOTES = (('"', '"'), ("'", "'"), ("“", "”"), ("‘", "’"), ("「", "」"), ("『", "』"), ("`", "`"))
_META_RE = re.compile(  # run on ascii_lower'd text
    r"\b(?:such as|like|e\.g\.|for example|for instance|phrases?|strings?|patterns?|attacks?"
    r"|attackers?|injections?|jailbreaks?|payloads?|malicious|contains?|containing|detects?"
    r"|detector|filters?|flag(?:s|ged)?|keywords?|signatures?|examples?|called|known as)\b"
    r"|例如|比如|譬如|诸如|类似|这类|这种|此类|攻击|注入|恶意|关键词|短语|字样|检测|过滤|示例|样例|所谓"
)


@dataclass(frozen=True, slots=True)
class InjectionCue:
    """One place where text gives orders to the model reading it."""

    kind: CueKind
    start: int
    end: int
    text: str


def _word_start(low: str, start: int) -> bool:
    """A Latin word does not begin inside another ("ai" in "said")."""
    return (
        start == 0
        or not (low[start].isascii() and low[start].isalpha())
        or not (low[start - 1].isascii() and (low[start - 1].isalnum() or low[start - 1] == "_"))
    )


def _line_start(low: str, start: int) -> bool:
    """Only spaces and tabs before `start` on its line."""
    return not low[low.rfind("\n", 0, start) + 1 : start].strip(" \t")


def _quoted(text: str, start: int, end: int) -> bool:
    """The span sits inside a pair of quotes on its own line."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line = text[line_start : len(text) if line_end < 0 else line_end]
    at, to = start - line_start, end - line_start
    for opening, closing in _QUOTES:
        left = line.rfind(opening, 0, at)
        if left < 0:
            continue
        right = line.find(closing, to)
        if right >= 0 and (opening != closing or line.count(opening, 0, at) % 2 == 1):
            return True
    return False


def _discussed(text: str, start: int, end: int) -> bool:
    """A quoted cue in a sentence that talks about such text (an example, a detector's rule)."""
    if not _quoted(text, start, end):
        return False
    sentence_start = max(
        text.rfind(mark, 0, start) for mark in (".", "。", "\n", "!", "！", "?", "？")
    )
    sentence_end = min(
        (i for i in (text.find(mark, end) for mark in ("\n", "。", "！", "？")) if i >= 0),
        default=len(text),
    )
    around = text[sentence_start + 1 : start] + " " + text[end:sentence_end]
    return _META_RE.search(ascii_lower(around)) is not None


def _cues(text: str) -> Iterator[InjectionCue]:
    """Each cue where it stands, by cue (not in text order)."""
    low = ascii_lower(text)
    ascii_only = low.isascii()
    for compiled in _COMPILED:
        if not compiled.possible(low, ascii_only):
            continue
        for match in compiled.pattern.finditer(low):
            at, end = match.span()
            if not _word_start(low, at) or (compiled.cue.line_start and not _line_start(low, at)):
                continue
            if not _discussed(text, at, end):
                yield InjectionCue(compiled.cue.kind, at, end, text[at:end])


def injection_cues(text: str) -> list[InjectionCue]:
    """Every place `text` gives orders to the model, in order of appearance (kinds above); where
    cues overlap, the first (the longest on a tie) stands for them."""
    found: list[InjectionCue] = []
    for cue in sorted(_cues(text), key=lambda c: (c.start, -c.end)):
        if not found or cue.start >= found[-1].end:
            found.append(cue)
    return found


def gives_orders(text: str) -> bool:
    """True when `text` (not the user's own words) gives orders to the model reading it."""
    return next(_cues(text), None) is not None
