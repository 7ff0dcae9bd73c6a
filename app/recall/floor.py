"""The relevance floor: whether recall's best match answers the query asked, or is only the
nearest thing a session holds to a question it knows nothing about.

Recall always has a nearest neighbour, and its fused and rerank scores are relative (each arm is
min-max normalised over the candidates, the rerank divides by the best fused score), so they rank
well but cannot tell "the answer" from "the least unrelated chunk". Absolute signals can:

- lexical: the share of the query's own terms the item holds, each weighted by its IDF over the
  session's chunks (compared by stem; Chinese by character, held through the query's bigrams;
  question words such as 什么, 多少, "many" left out). A term the session never holds
  ("mercury", "kelvin", 沸点) weighs the most and is held by nothing: a question about
  something the conversation never mentioned scores low, whatever small talk shares its other
  words.
- familiar: the share of that weight on terms some chunk of the session holds, times
  `FAMILIAR_SHARE`: a question about what the conversation talks of, though no single item
  holds its words (LoCoMo's paraphrased questions, 我能吃多辣 against 我一点辣都不能吃), is
  not noise.
- named: an item that names someone or something the question names (a capitalised word
  that does not start a sentence: "Nate", "Tampa"; a title in 《》; `query_names`), written as
  the question writes it, is about what the question asks about: `NAMED_RELEVANCE`. A
  speaker's name is in every chunk of their conversation, so its IDF weighs nothing lexically,
  yet a question about them is not noise. A name is held only as written, never word by word
  or character by character, lexically or as familiar: "The Four Seasons" is not held by "four
  days in cherry blossom season", nor 《百年孤独》 by a chat that holds 百 and 年. A question
  that names someone or something no chunk mentions is about another conversation: it is not
  familiar, and the words an item shares with it count `STRANGER_SHARE` (of LoCoMo's questions
  asked of another conversation than theirs, 63 % reached a floor of .25 without this, 14 %
  with it; none of their own lost their recall).
- vector: the item's cosine similarity to the query, above what unrelated texts reach with the
  e5 embedder and its query adapter (`VECTOR_ZERO`: the no-history set's questions reach .742
  against the travel chat), scaled so `VECTOR_ONE` counts as a full match. On LoCoMo the
  answering chunks sit in the same range (median .64), so it decides little there.

- by meaning, where no word is shared: none of the three can tell there. Across scripts (a
  Chinese question, an English item, or the reverse) the lexical share is 0, and e5 places a
  question and the fact that answers it in the other language no closer than an unrelated
  question and small talk (the no-history set's questions reach the cross-language facts'
  similarities). In one script, a question about the user ("What is my job?", 我害怕什么？) and the
  fact that answers it in other words ("I work as a pharmacist") share no word, and e5 puts them
  where a question about the world reaches small talk. What does separate them is two encoders
  together: `MEANING_E5_WEIGHT` of the item's e5 similarity to the question as embedded, without
  the query adapter (the adapter, fitted on English dialogue, moves a Chinese question toward
  English small talk as much as toward its answer), plus the rest of the largest similarity the
  multilingual Universal Sentence Encoder gives the question and one of the item's lines
  (`compared_lines`: in the other script, or the user's in its own). Scaled between
  `MEANING_ZERO` and `ACROSS_ONE` (lines in the other script) or `OWN_ONE` (in the question's
  own: e5 and USE place texts of one script closer). Across scripts every item is judged so; in
  one script only for a question about the user (`asks_about_the_user`): the answer to such a
  question can only be something the user said, and a question about the world ("How do I
  reverse a linked list?") is the model's to answer, not recall's. The service computes both
  similarities only for the memory tool's recall while the floor is on, for the first
  `CONFIDENT_WITHIN` items that hold such lines.

An item's relevance is the largest of these (an ID or a number the session holds once weighs
the most, so an exact hit scores high lexically); recall is confident when one of its first
items reaches the floor (`CONTEXTD_RECALL__RELEVANCE_FLOOR`, 0.25 by default). The constants
and the floor were set on the LoCoMo tune split (conversations 0-3) and the tune half of the
no-history set (its questions at even positions); the named signal on what the no-history
set's questions of both halves were quoted for, checked on LoCoMo's questions asked of another
conversation than theirs; docs/BENCHMARKS.md, "Confident or silent".

Pure: no I/O, no settings.
"""

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.domain.dates import MONTHS
from app.domain.stem import stem
from app.domain.text import holds_cjk, is_cjk, match_terms, mostly_cjk, terms
from app.recall.bm25 import idf
from app.recall.trim import line_stems

NAME_RE = re.compile(r"[A-Za-z][A-Za-z'’]*")  # a word, with its apostrophe
TITLE_RE = re.compile(r"《([^》]+)》")  # a book's, a film's or a work's title
# Capitalised without being names: words a title capitalises, "I'm", and dates (recall matches
# dates against each chunk's dates).
NOT_NAMES = frozenset(
    {"and", "are", "but", "did", "does", "for", "from", "has", "have", "how", "not", "the"}
    | {"was", "what", "when", "where", "which", "who", "why", "will", "with", "would"}
    | {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}
)
# What an item that names what the question names is worth: above the floors measured (.25-.35).
NAMED_RELEVANCE = 0.4
# What the words an item shares with a question naming a stranger to the session are worth:
# "What did Maria do with her church friends?" asked of a chat that never mentions Maria.
STRANGER_SHARE = 0.5
VECTOR_ZERO = 0.75
VECTOR_ONE = 0.85
# Words that ask rather than say what is asked about: no answer holds them (什么 of 我叫什么名字,
# 多少 of 多少钱, "many" of "how many", "most" of "which has the most").
QUESTION_WORDS_RE = re.compile(
    r"为什么|什么|怎么|怎样|多少|哪里|哪儿|哪个|哪些|哪|谁|吗|呢|\b(?:much|many|most)\b",
    re.IGNORECASE,
)


def asked_terms(query: str) -> list[str]:
    """The terms of what `query` asks about: its terms, without the words that ask
    (`QUESTION_WORDS_RE`), which any other question or answer may hold too."""
    return terms(QUESTION_WORDS_RE.sub(" ", query))


# What a query whose words the session holds (anywhere) is worth to each item: at a floor of 0.3
# when 40 % of its weight is on words the session holds.
FAMILIAR_SHARE = 0.75
# By meaning: the weight of the e5 similarity beside USE's, and the combined similarity that
# counts as nothing (7 of the no-history set's tune half, its 25 questions at even positions,
# reach .60 against the travel chat's items in the other script; the highest .628, the check
# half's .631, below a floor of .25 across scripts: .6375) and as a full match: across scripts
# the cross-language facts' 90th percentile, .74; in one script .80, which puts a floor of .25
# at .65, between the highest of the no-history set's tune questions about the user (.632,
# "How long should I boil an egg for a runny yolk?") and the 10th percentile of the tune
# facts' questions about the user in their own language (.666 in English, .689 in Chinese).
MEANING_E5_WEIGHT = 0.7
MEANING_ZERO = 0.60
ACROSS_ONE = 0.75
OWN_ONE = 0.80
# A question about the user: "I", "my", "we", 我 (我们). "How do I …" and 我该怎么 ask how
# something is done, not about the user.
ABOUT_THE_USER_RE = re.compile(r"\bI\b|\b(?:[Mm]y|[Mm]e|mine|myself|[Ww]e|[Oo]ur|us)\b|我")
HOW_TO_RE = re.compile(
    r"\bhow (?:do|can|should|would|could|to) I\b|我(?:该|要|应该|应|能)?怎么|我(?:该|要|应该)?如何",
    re.IGNORECASE,
)
# A turn's label in a chunk's text ("user: ", "assistant (planner): ", "tool[call_1]: "): not
# what the turn says.
TURN_LABEL_RE = re.compile(r"^(?P<role>[a-z]+)(?:\[[^\]\n]*\])?(?: \([^)\n]*\))?: ")
# The best of this many ranked items decides: an item ranked lower is not what recall quotes first.
CONFIDENT_WITHIN = 10


@dataclass(frozen=True, slots=True)
class QueryWeights:
    """What the query's terms weigh: `units` its words' stems and its CJK characters, each with
    its IDF; `pieces` the terms a text may hold, each with the units holding it covers."""

    units: dict[str, float]
    pieces: dict[str, tuple[str, ...]]
    # The share of the units' weight on units some chunk of the session holds: 0 for a question
    # about something the conversation never mentioned.
    familiar: float = 0.0
    # The question's names (`query_names`) by their unit: held only where written as a name.
    names: dict[str, re.Pattern[str]] = field(default_factory=dict)
    # The question names someone or something no chunk of the session mentions: it is about
    # another conversation than this one, whatever other words the two share.
    stranger: bool = False


def query_names(query: str) -> list[str]:
    """The words `query` capitalises that do not start a sentence, possessive `'s` dropped,
    three letters or more, other than `NOT_NAMES`, months and "I'm": the people, places and
    titles it names ("Nate", "Tampa", "Four", "Seasons"); and the titles it puts in 《》."""
    found: list[str] = []
    for match in NAME_RE.finditer(query):
        before = query[: match.start()].rstrip(" \"'“‘(")
        word = re.sub(r"['’]s$", "", match.group()).replace("’", "'")
        starts_sentence = not before or before[-1] in ".?!:;\n"
        if starts_sentence or not word[0].isupper() or len(word) < 3 or word in found:
            continue
        if word.lower() not in NOT_NAMES and word.lower() not in MONTHS and "'" not in word:
            found.append(word)
    return found + [t for t in TITLE_RE.findall(query) if t.strip() and t not in found]


def name_patterns(query: str) -> list[tuple[tuple[str, ...], re.Pattern[str]]]:
    """Each of `query_names` as the units it covers (a word's stem; a title's characters) and
    the pattern a text holds it by: as written, a word whole."""
    out: list[tuple[tuple[str, ...], re.Pattern[str]]] = []
    for name in query_names(query):
        if holds_cjk(name):
            out.append((tuple(name), re.compile(re.escape(name))))
        else:
            out.append(((stem(name.lower()),), re.compile(rf"\b{re.escape(name)}\b")))
    return out


def query_weights(
    query: str, df: Callable[[str], int], n_docs: int, *, dated: bool = False
) -> QueryWeights:
    """The query's own terms as relevance counts them, weighted by IDF over the `n_docs` chunks
    (`df`: how many hold a term). A word counts by its stem. Chinese counts by character, each
    weighted by its own IDF (的 or 多 little, 沸 much), held when a text holds one of the
    query's bigrams with it: the bigrams across two words (的旅 of 京都的旅馆) are in no text,
    and weighting them would sink every Chinese question. A lone character counts only when
    the query has nothing longer.
    `dated`: the query names a day or month, which recall matches against each chunk's dates,
    not its text: the date's words (numbers, month names) do not count."""
    found = asked_terms(query)
    wanted = match_terms(found)
    units: dict[str, float] = {}
    pieces: dict[str, tuple[str, ...]] = {}
    heard: dict[str, bool] = {}
    for term in found:
        if not is_cjk(term):
            if term in wanted and not (dated and (term.isdigit() or term in MONTHS)):
                key = stem(term)  # the session's index holds stems
                units[key] = idf(n_docs, df(key))
                heard[key] = df(key) > 0
                pieces[key] = (key,)
        elif len(term) > 1:
            pieces[term] = tuple(term)
        else:
            units[term] = idf(n_docs, df(term))
            heard[term] = df(term) > 0
            if term in wanted:
                pieces[term] = (term,)
    named = name_patterns(query)
    names = {unit: pattern for covered, pattern in named for unit in covered if unit in units}
    # A name with a unit no chunk holds (a character of a title, the stem of a word).
    stranger = any(any(df(unit) == 0 for unit in covered) for covered, _ in named)
    total = sum(units.values())
    # A name counts through the named signal, not as familiar: "four" and "season" in a chat
    # do not make "The Four Seasons" familiar, nor 百 and 年 《百年孤独》.
    held = sum(w for unit, w in units.items() if heard[unit] and unit not in names)
    familiar = held / total if total > 0 and not stranger else 0.0
    return QueryWeights(units, pieces, familiar, names, stranger)


def lexical_relevance(weights: QueryWeights, text: str) -> float:
    """The IDF-weighted share of the query's units (`query_weights`) that `text` holds."""
    total = sum(weights.units.values())
    if total <= 0:
        return 0.0
    held = line_stems(text)
    covered = {unit for key, piece in weights.pieces.items() if key in held for unit in piece}
    written = {unit for unit, name in weights.names.items() if name.search(text)}
    share = (
        sum(
            w
            for unit, w in weights.units.items()
            if unit in covered and (unit not in weights.names or unit in written)
        )
        / total
    )
    return STRANGER_SHARE * share if weights.stranger else share


def named_relevance(weights: QueryWeights, text: str) -> float:
    """`NAMED_RELEVANCE` when `text` names one of the question's names as it writes it."""
    return NAMED_RELEVANCE if any(name.search(text) for name in weights.names.values()) else 0.0


def vector_relevance(similarity: float | None) -> float:
    """The cosine similarity above `VECTOR_ZERO`, scaled so that `VECTOR_ONE` is 1 (None: the
    vector arm did not return the item)."""
    if similarity is None:
        return 0.0
    return max(0.0, (similarity - VECTOR_ZERO) / (VECTOR_ONE - VECTOR_ZERO))


def compared_lines(query: str, text: str, *, across: bool) -> list[str]:
    """The lines of `text` written in the other script than `query` (`across`: Chinese against
    Latin, `mostly_cjk`), or the lines of its user turns written in the query's own script (a
    question about the user is answered by what the user said: not by a tool's output, whose
    lines are many, nor by small talk the assistant made of it), each without its turn label;
    blank lines left out."""
    chinese = mostly_cjk(query)
    if across and not chinese and not holds_cjk(text):
        return []  # every line in the query's script: the common case, without a line's count
    found: list[str] = []
    role = ""
    for line in text.splitlines():
        label = TURN_LABEL_RE.match(line)
        if label is not None:
            role, line = label["role"], line[label.end() :]
        line = line.strip()
        if line and (mostly_cjk(line) != chinese) == across and (across or role == "user"):
            found.append(line)
    return found


def asks_about_the_user(query: str) -> bool:
    """Whether `query` asks about the user ("What is my job?", 我会说哪些语言？), not how
    something is done ("How do I fix a merge conflict?", 我该怎么办)."""
    return ABOUT_THE_USER_RE.search(HOW_TO_RE.sub(" ", query)) is not None


def meaning_relevance(e5_similarity: float, line_similarity: float, *, across: bool) -> float:
    """An item's relevance by meaning, 0-1: from its e5 similarity to the unadapted query and
    the best USE similarity of its lines (`compared_lines`) in the other script than the
    query's (`across`) or in its own (module docstring)."""
    combined = MEANING_E5_WEIGHT * e5_similarity + (1 - MEANING_E5_WEIGHT) * line_similarity
    one = ACROSS_ONE if across else OWN_ONE
    return min(1.0, max(0.0, (combined - MEANING_ZERO) / (one - MEANING_ZERO)))


def relevance(
    weights: QueryWeights, text: str, similarity: float | None, by_meaning: float = 0.0
) -> float:
    """An item's relevance, 0-1: `lexical_relevance`, the familiar share, `named_relevance`,
    `vector_relevance` or `by_meaning` (its `meaning_relevance`, 0 when not computed), the
    largest, rounded as the manifest shows it."""
    score = max(
        lexical_relevance(weights, text),
        FAMILIAR_SHARE * weights.familiar,
        named_relevance(weights, text),
        vector_relevance(similarity),
        by_meaning,
    )
    return round(min(score, 1.0), 4)


@dataclass
class RelevanceJudge:
    """The relevance of items to one query, each computed once, when asked: recall judges its
    first `CONFIDENT_WITHIN` items, a build the items it shows, and no more (~15 µs an item).
    `similarity_counts`: vector similarities are on the scale the floor was calibrated on;
    `by_meaning`: each item's `meaning_relevance`, by id, for those judged so."""

    weights: QueryWeights
    similarity_counts: bool
    by_meaning: dict[str, float] = field(default_factory=dict)
    _known: dict[str, float] = field(default_factory=dict)

    def of(self, item_id: str, text: str, similarity: float | None) -> float:
        """The item's `relevance` (its similarity counts only when `similarity_counts`)."""
        known = self._known.get(item_id)
        if known is None:
            counted = similarity if self.similarity_counts else None
            meaning = self.by_meaning.get(item_id, 0.0)
            known = self._known[item_id] = relevance(self.weights, text, counted, meaning)
        return known


def confident(relevances: Sequence[float], floor: float) -> bool:
    """Whether one of the first `CONFIDENT_WITHIN` items (in rank order) reaches `floor`."""
    return any(r >= floor for r in relevances[:CONFIDENT_WITHIN])
