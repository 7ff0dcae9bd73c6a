"""The default notes generator: deterministic, offline rules for English and Chinese.

Who may say what (seed 003 §5.6: never turn a suggestion into a decision, nor an assistant guess
into a user fact):
- user turns give goals, constraints, decisions, open/done items and facts;
- assistant turns give only open/done items (progress reports and commitments). An assistant
  proposal becomes a decision only when the very next user turn starts with an affirmation ("yes",
  "好的") and the assistant turn holds exactly one proposal; it is then recorded as the user's
  decision at the confirming turn. Assistant statements never become facts or constraints;
- tool turns give facts only, marked `trusted=False`; system turns give nothing (C0 is separate).

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
import string
from collections.abc import Sequence
from typing import Any

from app.core.text import ENGLISH_STOPWORDS, terms
from app.domain.records import TurnRecord
from app.notes.policy import merge
from app.notes.schemas import SECTION_NAMES, NoteItem, Notes, SectionName, Source

_I, _CJK = re.IGNORECASE, "\u4e00-\u9fff"
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])|\n+")
_CLAUSE_SPLIT_RE = re.compile(r"[，；]|[,;](?=\s*[^\s\d])")
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
_GOAL_RE = re.compile(
    r"\b(?:i want to|i'd like to|i would like to|i need to|we need to|we want to|my goal"
    r"|our goal|the goal|i'm trying to|we're trying to|i'm planning to|i plan to|we plan to)\b"
    r"|目标|我(?:们)?(?:想(?!想)|要(?!求)|打算|计划|希望)"
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
    re.compile(rf"对(?P<x>[{_CJK}A-Za-z]{{1,6}}?)(?:严重|有点|特别)?过敏"),
    re.compile(rf"(?:不能吃|不能喝|不能碰)(?P<x>[{_CJK}]{{1,6}}?)[，,。]"),
    re.compile(rf"(?P<x>[{_CJK}]{{1,4}}?)(?:严重|有点)?过敏"),
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
_MONTHS = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_MONTHS_LOW = _MONTHS.lower()
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
_TIME_RE = re.compile(_TIME)
_DEADLINE_RE = re.compile(
    r"\b(?:due|deadline|no later than|at the latest|latest by|cut-?off|closes? on|last day"
    r"|expires?|expiry)\b|截止|最迟|最晚|期限|到期|关闭"
)
_COMMIT_RE = re.compile(
    r"\b(?:i'll|i will|i'm going to|i am going to|i promise|i can|we'll|we will|i shall"
    r"|you'll have|you will have|from me)\b"
    r"|我(?:们)?(?:会|将|保证|答应|一定|马上|尽快)?[^，。；！？]{0,12}?"
    r"(?:发|交|送|寄|带|上传|给|付|打电话|提交|回复|转账|汇)"
)
_ZH_DECISION = r"决定|(?<!不)确定|采用|就用|选用|就选|选定|定了|改用|换用|改成|改为|换成"
_DECISION_RE = re.compile(
    r"\b(?:decided|decide to|decision (?:on|is)|we'll use|we will use|i'll use|we'll go with"
    r"|we will go with|let's go with|let's use|let's do|let's take|go with|going with|settled on"
    r"|we'll take|i'll take|(?<!you )(?:picked|chose)|i choose|opt(?:ing)? for)\b"
    r"|^(?:(?:ok|okay|alright|fine|then),?\s+)?[\w' -]{1,40}? it is"
    r"(?: for (?:the|our|my) [\w-]+)?[.!]?$"
    r"|^(?:please\s+)?book\b"
    rf"|{_ZH_DECISION}|^(?:我们|那就|那|就|还是)?用(?=\S)|^[{_CJK}]{{1,6}}用(?=[A-Za-z])"
    rf"|^[{_CJK}]{{1,8}}?(?:就用|就选|选|定|按)(?=[{_CJK}A-Za-z])|^那?[{_CJK}]{{1,6}}就[{_CJK}]{{2,}}了"
)
_ZH_VERB_RE = re.compile(_ZH_DECISION + r"|还是用|还是选|就用|就选|就|用|选|定|按|换|要")
_UNDECIDED_RE = re.compile(
    r"not (?:yet )?decided|haven't decided|undecided|还没(?:有)?(?:决定|确定)|未定|待定"
    r"|(?:要|得|需要|还得|再)(?:决定|确定|定|选)"
)
_SUGGESTION_RE = re.compile(
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
_UPDATE_RE = re.compile(
    r"\b(?:changed|change to|updated?|now|new|reset|correction|corrected|from now on"
    r"|from today|no longer|instead)\b"
    r"|改了|改成|改为|更新|现在是|新的|重置|更正|换成|以后|从今天起|不再"
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
    rf"|\d{{1,2}}月\d{{1,2}}[日号]|\b\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTHS}(?:,? \d{{4}})?"
    rf"|\b{_MONTHS} \d{{1,2}}(?:st|nd|rd|th)?\b(?:,? \d{{4}})?)"
    r"|(?P<amount>[¥$€£] ?\d[\d,]{0,24}(?:\.\d{1,6})?"
    r"|(?<!\d)\d[\d,]{0,24}(?:\.\d{1,6})? ?(?:万元|元|块|美元|欧元"
    r"|(?i:usd|eur|cny|rmb|gbp|jpy|dollars?|euros?|yuan))(?![A-Za-z]))"
    r"|(?P<id>#\d{4,}|(?<![A-Za-z0-9])(?:[A-Z]+\d|\d+[A-Z])[A-Z0-9]*(?:-[A-Z0-9]+)*(?<=\w{5})"
    r"(?![A-Za-z0-9])|(?<![A-Za-z0-9])[A-Z]{1,5}-\d{3,}(?:-\d+)*(?![A-Za-z0-9])"
    r"|(?<![\d.])\d{5,}(?!\d|\.\d))"
    rf"|(?P<quantity>(?<!\d)\d{{1,12}}(?:\.\d{{1,6}})? ?-? ?(?:{_UNITS}))"
)
_STRONG_KINDS = frozenset({"url", "email", "id", "date", "amount"})
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
    rf"(?:欧阳|司马|上官|诸葛|东方|皇甫|尉迟|公孙|慕容|令狐|[{_SURNAMES}])[{_CJK}]{{1,2}}?"
    rf"(?=[，。！？、,.!?\s]|$|[想要在是的了吧就，])"
)
_NAME_ZH_RE = re.compile(
    rf"(?:我的名字|名字)(?:是|叫)(?P<a>[{_CJK}]{{2,4}}?)(?=[，。！？,.!?\s]|$)"
    rf"|我叫(?P<b>[{_CJK}]{{2,3}}?)(?=[，。！？,.!?\s]|$|就)"
    rf"|(?:本人|我是|全名(?:是|叫)?|(?:^|[，,])叫|收件人(?:是|为)?[：:]?|联系人(?:是|为)?[：:]?)"
    rf"(?P<c>{_ZH_NAME})"
    rf"|我(?P<rel>{_ZH_RELATIONS})(?:的名字)?(?:叫|是)(?P<d>{_ZH_NAME})"
)
_EN_TRAIL = frozenset(
    re.findall(
        r"\S+",
        "is are was were be been must should can could will would stay stays remain remains keep "
        "has have to need needs take takes cost costs last lasts spend it of with not do does "
        "shall may might always get set at for on about around approximately roughly equals "
        "actually ok okay so well now also new old current updated latest correct",
    )
)
_SUBJECT_PRONOUNS = frozenset("i we you he she they i've we've i'd we'd i'm we're".split())
_COPULA = frozenset("is are was were has have weighs measures costs takes lasts equals".split())
_ZH_TRAIL_RE = re.compile(
    r"(?:是|为|要|得|必须|应该|控制在|定在|定于|在|改成|改为|调整为|调到|也|都|就|还|可以|能|会"
    r"|总共|一共|共|大概|大约|约|可能|最好|尽量|：|:)+$"
)
_ZH_LEAD_RE = re.compile(
    r"^(?:其实|那么|那就|那|还是|我们|咱们|我|你|您|这次|另外|而且|但是|所以|最后|最终|嗯|好|算了"
    r"|我改主意了|决定)+"
)
_ZH_NARRATIVE_RE = re.compile(r"^[我你他她它]|[了完过着]$")


def _key(text: str) -> str | None:
    cleaned = re.sub(r"[\s_]+", " ", re.sub(r"[^\w\s.+@-]", " ", text.casefold())).strip(" .-")
    return cleaned[:40] or None


def _lower(text: str) -> str:
    """ASCII letters lowered, nothing else changed (same length, so positions carry over). The
    cue patterns are written in lower case and run without IGNORECASE, which is several times
    slower in `re`."""
    return text.translate(_ASCII_LOWER)


def _has_cjk(text: str) -> bool:
    return re.search(f"[{_CJK}]", text) is not None


def _strip_lead(text: str) -> str:
    """The sentence without a leading discourse marker ("By the way, ", "对了，")."""
    text = text.strip()
    lead = _LEAD_RE.match(_lower(text))
    return (text[lead.end() :].strip() if lead else text) or text


def _noun_before(prefix: str, words_kept: int = 1) -> str | None:
    """The head of the noun phrase ending `prefix` ("The total budget is" -> "budget"), keeping
    the last `words_kept` English words ("My order number is" -> "order number" with 2)."""
    part = re.split(r"[,，:：;；]", prefix.rstrip(" :：=#\"'-"))[-1]
    part = re.split(r"[$¥€£\d]", part)[0].strip()
    if _has_cjk(part):
        part = _ZH_LEAD_RE.sub("", _ZH_TRAIL_RE.sub("", part).removesuffix("的").split("的")[-1])
        return part[-6:] or None
    words = [w.casefold() for w in re.findall(r"[A-Za-z][\w'-]*", part)]
    words = [w for w in words if w not in _EN_TRAIL and w not in ENGLISH_STOPWORDS]
    return " ".join(words[-words_kept:]) or None


def _labels_quantity(prefix: str) -> bool:
    """A bare number with a unit is a fact only when a noun labels it: "the disk has 2.5 GB",
    "距离12 km" — not "I've been waiting for 20 minutes" nor "我都等了20分钟"."""
    part = re.split(r"[,，:：;；.。!！]", prefix)[-1].strip()
    if _has_cjk(part):
        run = re.findall(f"[{_CJK}]+", part)
        return bool(run) and not _ZH_NARRATIVE_RE.search(run[-1]) and not part.endswith(" ")
    words = [w.casefold() for w in re.findall(r"[A-Za-z][\w'-]*", part)]
    if words and words[-1] in _COPULA:
        words = words[:-1]
    narrative = len(words) > 1 and words[-2] in _SUBJECT_PRONOUNS  # "I slept 9 hours"
    return (
        bool(words)
        and not narrative
        and words[-1] not in _EN_TRAIL
        and words[-1] not in ENGLISH_STOPWORDS
        and not words[-1].endswith(("ed", "ing"))
    )


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


def _head(phrase: str) -> str | None:
    """The head noun of an object phrase: its last English word without a plural s, or the last
    two characters after 的 ("aisle seats" -> "seat", "靠窗的座位" -> "座位")."""
    phrase = re.split(
        r"[,，。;；!！?？]|\b(?:please|if|when|because|so|and|but)\b", phrase, flags=_I
    )[0]
    if _has_cjk(phrase):
        run = re.sub(r"[了吧啊呢的\s]+$", "", phrase.split("的")[-1].strip())
        return run[-2:] or None
    words = [w.casefold() for w in re.findall(r"[A-Za-z][\w'-]*", phrase)]
    words = [w for w in words if w not in ENGLISH_STOPWORDS and w not in _EN_TRAIL]
    return _singular(words[-1]) if words else None


def _singular(word: str) -> str:
    if word.endswith(("sses", "xes", "ches", "shes", "uses")):
        return word[:-2]
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _constraint_subject(text: str) -> str | None:
    limit = _LIMIT_RE.search(text)
    if limit:
        noun = _noun_before(text[: limit.start()]) or _unit_after(text[limit.end() :])
        if noun:
            return f"{_key(noun)} ({'max' if limit.group('max') else 'min'})"
    marker = _CONSTRAINT_RE.search(text)
    return _key(_first_words(text[marker.end() :])) if marker else None


def _health_subject(text: str) -> str:
    for pattern in _ALLERGEN_RES:
        match = pattern.search(text)
        if match:
            what = _HEALTH_NOISE_RE.sub("", match.group("x")).strip()
            if what and what.casefold() not in ENGLISH_STOPWORDS:
                return f"health: {_key(_singular(what) if len(what) > 4 else what)}"
    condition = _HEALTH_RE.search(text)
    return f"health: {_key(condition.group(0) if condition else text)}"


def _preference_subject(match: re.Match[str], text: str) -> str | None:
    head = _head(text[match.end() :])
    polarity = "dislikes" if match.group("neg") or match.group("zneg") else "likes"
    return f"{polarity}: {head}" if head else None


def _deadline_subject(text: str, marker: re.Match[str]) -> str:
    noun = _noun_before(text[: marker.start()], 2)
    if not noun:
        what = re.search(r"\bfor (?:the |my |our )?([A-Za-z][\w-]*)", text[marker.end() :])
        noun = what.group(1) if what else None
    return f"deadline: {_key(noun)}" if noun else "deadline"


def _zh_slot(text: str) -> str | None:
    """The slot a Chinese decision names: the words before its verb ("套餐改成…" -> "套餐",
    "算了，配送方式换…" -> "配送方式", "那酒店就…了" -> "酒店")."""
    if not _has_cjk(text):
        return None
    for clause in reversed(re.split(r"[，,]", text)):
        for verb in _ZH_VERB_RE.finditer(clause):
            before = re.sub(r"(?:就|还是|都|也|先|我们|决定)+$", "", clause[: verb.start()].strip())
            head = _ZH_LEAD_RE.sub("", before)
            if head and len(head) <= 8 and not re.match(r"[想要能得不]|可以", head):
                return head if not _CORRECTION_RE.search(head) else None
    return None


def _negated(text: str) -> str | None:
    """What a retraction takes back ("not X anymore" -> X), if the text is one."""
    if not _RETRACT_HINT_RE.search(text):
        return None
    return next((m.group("x").strip() for r in _RETRACT_RES if (m := r.search(text))), None)


def _is_question(text: str) -> bool:
    return _QUESTION_RE.search(_lower(text).strip()) is not None


def _fact_kind(text: str) -> str | None:
    """The kind of entity a fact text holds (for updates that replace the latest of a kind)."""
    low = _lower(text)
    if _CODE_VALUE_RE.search(text) and (_CODE_LABEL_RE.search(low) or _CODE_ENTRY_RE.search(low)):
        return "code"
    match = _FACT_RE.search(text)
    return match.lastgroup if match else None


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

    def earlier(self, section: SectionName) -> list[NoteItem]:
        """Earlier items of a section, newest first."""
        return [item for name, item in reversed(self.context) if name == section]

    def containing(self, needle: str) -> tuple[SectionName, NoteItem] | None:
        found = (e for e in reversed(self.context) if needle.casefold() in e[1].text.casefold())
        return next(
            (e for e in found if e[0] in ("goal", "constraints", "decisions", "open")), None
        )

    def named_decision(self, text: str) -> NoteItem | None:
        """The latest earlier decision whose subject this text names ("the hotel", "套餐")."""
        words = set(terms(text))
        for item in self.earlier("decisions"):
            subject = item.subject or ""
            if not subject or subject.endswith(")"):
                continue
            if _has_cjk(subject) and subject in text:
                return item
            if not _has_cjk(subject) and set(terms(subject)) <= words:
                return item
        return None

    def decision_subject(self, text: str) -> str | None:
        named = self.named_decision(text)
        if named:
            return named.subject
        for pattern in _SLOT_RES:
            slot = pattern.search(text)
            if slot:
                return _key(slot.group(1))
        head = _zh_slot(text)
        if head:
            return _key(head)
        if _CORRECTION_RE.search(text):
            # A correction replaces the earlier decision it shares a word with, else the latest.
            earlier = [i for i in self.earlier("decisions") if i.subject]
            words = set(terms(_CORRECTION_RE.sub(" ", text))) - ENGLISH_STOPWORDS
            shared = [i for i in earlier if words & set(terms(i.text))]
            if shared or earlier:
                return (shared or earlier)[0].subject
        marker = _DECISION_RE.search(text)
        return _key(_first_words(text[marker.end() :] if marker else text))

    def is_decision(self, text: str) -> bool:
        if _SUGGESTION_RE.search(text) or _UNDECIDED_RE.search(text):
            return False
        if _DECISION_RE.search(text):
            return True
        if not _CORRECTION_RE.search(text):
            return False
        slot = any(p.search(text) for p in _SLOT_RES) or _zh_slot(text) is not None
        return slot or self.named_decision(text) is not None

    def facts(self, text: str, seq: int, source: Source, trusted: bool,
              strong_only: bool = False) -> bool:  # fmt: skip
        """Typed entities of `text` as facts; True when any was found."""
        found = False
        for clause in _CLAUSE_SPLIT_RE.split(text):
            if strong_only and _is_question(clause):
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
                segment = re.sub(
                    r"^[\s\"'{}\[\],]*(?:and|和|及|以及|还有)?\s*", "", clause[start:end]
                )
                label = _noun_before(clause[start : match.start()], 2)
                kind = match.lastgroup or "fact"
                subject = _key(label) if label else _key(f"{kind}:{match.group(0)}")
                if source == "user" and _UPDATE_RE.search(_lower(text)):
                    subject = self.updated_subject(kind) or subject
                self.add("facts", segment.strip(" \"'{}[],"), seq, source, subject, trusted)
                found = True
        return found

    def updated_subject(self, kind: str) -> str | None:
        """The subject of the latest earlier fact of this kind (an update replaces it)."""
        return next((i.subject for i in self.earlier("facts") if _fact_kind(i.text) == kind), None)

    def names(self, text: str, seq: int) -> bool:
        found = False
        for clause in _CLAUSE_SPLIT_RE.split(text):
            subject = None
            if _has_cjk(clause):
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
                    subject = (
                        f"{match.group('rel').casefold()} name" if match.group("rel") else "name"
                    )
                    break
            if subject:
                self.add("facts", clause.strip(" ,，"), seq, "user", _key(subject))
                found = True
        return found

    def codes(self, text: str, seq: int) -> bool:
        low = _lower(text)
        label = _CODE_LABEL_RE.search(low)
        entry = _CODE_ENTRY_RE.search(low)
        if not _CODE_VALUE_RE.search(text) or not (label or entry):
            return False
        if label and _has_cjk(text):
            run = re.findall(f"[{_CJK}]+", low[: label.end()])
            qualifier = _ZH_LEAD_RE.sub("", run[-1] if run else label.group(0))
            subject = _key(qualifier[-8:])
        elif label:
            after = re.match(
                r"\s+(?:for|of) (?:the |my |our )?([a-z]+(?: [a-z]+)?)", low[label.end() :]
            )
            noun = after.group(1) if after else _noun_before(low[: label.start()])
            subject = _key(f"{noun} {label.group(0)}" if noun else label.group(0))
        else:
            subject = "code"
        if _UPDATE_RE.search(low):
            subject = self.updated_subject("code") or subject
        self.add("facts", text, seq, "user", subject)
        return True

    def user_sentence(self, raw: str, seq: int) -> None:
        text = _strip_lead(raw)
        low = _lower(text)  # the cue patterns' input; items keep `text`
        if _is_question(text):
            if _OPEN_RE.search(low) or _UNDECIDED_RE.search(low):
                self.add("open", text, seq, "user", None)
            else:
                self.facts(text, seq, "user", True, strong_only=True)
            return
        negated = _negated(low)
        target = self.containing(negated) if negated and len(negated) >= 2 else None
        if target:
            self.add(target[0], text, seq, "user", target[1].subject)
            return
        if self.codes(text, seq):  # "门禁码换成…" is a code update, not a decision
            return
        decision = self.is_decision(low)
        if decision:
            self.add("decisions", text, seq, "user", self.decision_subject(low))
        subject = self.constraint(low, negated if not decision else None)
        if subject is not None:
            self.add("constraints", text, seq, "user", subject or None)
            return
        if decision:
            return
        committed = _COMMIT_RE.search(low) and _TIME_RE.search(low)
        if committed or _OPEN_RE.search(low) or _UNDECIDED_RE.search(low):
            self.add("open", text, seq, "user", None)
        elif _GOAL_RE.search(low):
            self.add("goal", text, seq, "user", None)
        elif self.names(text, seq) or self.facts(text, seq, "user", True):
            return
        elif _DONE_RE.search(low):
            self.add("done", text, seq, "user", None)

    def constraint(self, text: str, negated: str | None) -> str | None:
        """The subject of the constraint `text` (lowered) states ("" when it has none), or
        None."""
        if _HEALTH_RE.search(text):
            return _health_subject(text)
        deadline = _DEADLINE_RE.search(text)
        if deadline and _TIME_RE.search(text) and not _COMMIT_RE.search(text):
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
            return _key(negated) or ""
        return None

    def progress(self, text: str, seq: int, source: Source) -> None:
        """The assistant's progress: pending work, what is done, commitments with a time."""
        if _is_question(text):
            return
        low = _lower(text)
        if _OPEN_RE.search(low) or _UNDECIDED_RE.search(low):
            self.add("open", text, seq, source, None)
        elif _DONE_RE.search(low):
            self.add("done", text, seq, source, None)
        elif _COMMIT_RE.search(low) and _TIME_RE.search(low):
            self.add("open", text, seq, source, None)

    def confirm(self, proposal_turn: TurnRecord, seq: int) -> None:
        proposals = [
            s
            for s in sentences(proposal_turn.content)
            if _DECISION_RE.search(_lower(s)) or _PROPOSAL_RE.search(_lower(s))
        ]
        if len(proposals) == 1:
            text = f"User confirmed: {proposals[0]}"
            self.add("decisions", text, seq, "user", self.decision_subject(_lower(proposals[0])))


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
            low = _lower(turn.content)
            affirms = _AFFIRM_RE.search(low) and not _SUGGESTION_RE.search(low)
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
