"""Language-neutral text normalisation for chunking, lexical indexing and recall.

Chinese (and other CJK scripts) have no spaces, so a run of CJK characters is indexed as its
characters (unigrams) plus overlapping character bigrams; everything else is split into lower-cased
word tokens. The same function feeds the Postgres `tsvector` and the in-process BM25, so both arms
see identical terms.

Identifiers of code and data stay whole terms, so that they match exactly: `snake_case`,
`SECRET_CONST_3`, dotted names (`client.charge`, `mod3.py`), `HAT069`, `8ZC1KX` and CamelCase
(lower-cased: `billingclient`). A path (`billing/mod3.py`) is a term too, and so are its segments
(`billing`, `mod3.py`): a question names a file by its path or by its name alone.
"""

import re
import string
import unicodedata
from collections.abc import Iterable, Sequence
from itertools import chain

_CJK_CLASS = (
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf"  # CJK Extension A
    "\u4e00-\u9fff"  # CJK Unified Ideographs
    "\uf900-\ufaff"  # CJK Compatibility Ideographs
    "\uac00-\ud7af"  # Hangul syllables
)
_WORD = rf"[^\W_{_CJK_CLASS}]+"  # letters/digits, but not CJK (they form their own runs)
_CJK_RUN_RE = re.compile(rf"^[{_CJK_CLASS}]+$")

# Common English function words. Negations and limit words ("no", "not", "only", "more", "before",
# ...) are deliberately absent: they carry the meaning of constraints.
ENGLISH_STOPWORDS = frozenset(
    """a about again against all am an and any are as at be because been being between both but by
    can could did do does doing down during each for from further had has have having he her here
    hers herself him himself his how i if in into is it its itself just me my myself now of off on
    once or other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up very was
    we were what when where which while who whom why will with would you your yours yourself
    yourselves""".split()
)


# Chinese function characters (pronouns, particles, the commonest verbs, prepositions, measure
# words and question words): as single-character terms they match nearly any Chinese text, so
# they are left out the way English stopwords are, and so is a bigram of two of them, itself a
# function word ("我的" is "my", "什么" is "what"); a bigram with a content character stays
# ("是否", "哪家"). Negations (不, 没, 别) are kept, as in English.
CHINESE_STOP_CHARACTERS = frozenset(
    "我你他她它们这那个些"  # pronouns, demonstratives, measure words
    "的了着过吗呢吧啊呀么哦嗯"  # particles
    "是在有和就都也很与及而或把被给让对之其又还"  # common verbs, prepositions, adverbs
    "谁哪什怎"  # question words
)


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def ascii_lower(text: str) -> str:
    """ASCII letters lowered, nothing else changed (same length, so positions carry over). Cue
    patterns are written in lower case and run without IGNORECASE, which is several times
    slower in `re`."""
    return text.translate(_ASCII_LOWER)


def is_cjk(text: str) -> bool:
    return bool(_CJK_RUN_RE.match(text))


_CJK_CHARACTER_RE = re.compile(rf"[{_CJK_CLASS}]")
_WORD_RE = re.compile(_WORD)


def holds_cjk(text: str) -> bool:
    """Whether `text` holds a CJK character."""
    return _CJK_CHARACTER_RE.search(text) is not None


def mostly_cjk(text: str) -> bool:
    """Whether `text` is written mostly in CJK: more CJK characters than other words (a CJK
    character is about a word), so "Bart在圣诞节晚会上跳舞" is and "the 酒店 was fine" is not."""
    return len(_CJK_CHARACTER_RE.findall(text)) > len(_WORD_RE.findall(text))


def cjk_terms(run: str) -> list[str]:
    """Unigrams and overlapping bigrams of one run of CJK characters."""
    terms = list(run)
    terms.extend(run[i : i + 2] for i in range(len(run) - 1))
    return terms


# A run of CJK characters, or a word: what `terms` splits text into. Neither holds whitespace.
_TERM_TOKEN_RE = re.compile(rf"[{_CJK_CLASS}]+|{_WORD}(?:[-_.@/]{_WORD})*", re.UNICODE)
_KEPT_PIECE_CHARS = 32  # longer pieces (CJK sentences, long IDs) are rarely seen twice
_KEPT_PIECES = 65_536  # pieces kept before the table starts again


class _PieceTerms(dict[str, tuple[str, ...]]):
    """The terms of each whitespace-free piece of lower-cased text that `terms` meets, computed
    on first sight. Text repeats its words (with or without punctuation around them), so most
    pieces are found here and a text's terms are looked up piece by piece in C."""

    def __init__(self, stopwords: frozenset[str], stop_characters: frozenset[str]) -> None:
        super().__init__()
        self.stopwords = stopwords
        self.stop_characters = stop_characters
        # The terms of each CJK run: a long piece is seldom seen twice, its runs often are (a
        # log's Chinese fields around a number that changes on every line).
        self.runs: dict[str, tuple[str, ...]] = {}

    def __missing__(self, piece: str) -> tuple[str, ...]:
        found: list[str] = []
        for token in _TERM_TOKEN_RE.findall(piece):
            if _CJK_RUN_RE.match(token):
                found.extend(self.runs.get(token) or self._run_terms(token))
            elif "/" in token:
                found.extend(self._path_terms(token))
            elif token not in self.stopwords:
                found.append(token)
        kept = tuple(found)
        if len(piece) <= _KEPT_PIECE_CHARS:
            if len(self) >= _KEPT_PIECES:
                self.clear()
            self[piece] = kept
        return kept

    def _run_terms(self, run: str) -> tuple[str, ...]:
        kept = tuple(t for t in cjk_terms(run) if not self.stop_characters.issuperset(t))
        if len(run) <= _KEPT_PIECE_CHARS:
            if len(self.runs) >= _KEPT_PIECES:
                self.runs.clear()
            self.runs[run] = kept
        return kept

    def _path_terms(self, token: str) -> list[str]:
        """A path's segments, and the whole path when it looks like one: a letter, and three
        segments or one that is not a plain word (`billing/mod3.py`, `app/recall/rewrite`).
        Numbers and dates ("24/7", "5/7/2023") and words ("artists/bands", "and/or") are
        indexed by their parts as before."""
        segments = [s for s in token.split("/") if s and s not in self.stopwords]
        looks_like_path = len(segments) > 2 or any(not s.isalpha() for s in segments)
        if len(segments) > 1 and looks_like_path and any(c.isalpha() for c in token):
            return [token, *segments]
        return segments


_PIECES = {
    True: _PieceTerms(ENGLISH_STOPWORDS, CHINESE_STOP_CHARACTERS),
    False: _PieceTerms(frozenset(), frozenset()),
}


def terms(text: str, *, drop_stopwords: bool = True) -> list[str]:
    """Index/search terms of `text`: lower-cased words, CJK runs as unigrams + bigrams.

    No term spans whitespace, so the terms are those of the text's pieces between whitespace."""
    pieces = text.lower().split()
    return list(chain.from_iterable(map(_PIECES[drop_stopwords].__getitem__, pieces)))


_PART_SEPARATOR_RE = re.compile(r"[-_.@/]")


def lexical_document(text: str) -> str:
    """Space-joined terms for Postgres `to_tsvector('simple', ...)`, so it indexes our terms."""
    return terms_document(terms(text))


def terms_document(text_terms: Sequence[str]) -> str:
    """`lexical_document` of text whose `terms()` are already at hand.

    Punctuation inside identifiers (AB-12345, a.b@c.d, a/b.py) would be split by the 'simple'
    parser, so such terms are kept whole and also contribute their parts (CJK terms hold no
    separator).
    """
    joined = " ".join(text_terms)
    if not _PART_SEPARATOR_RE.search(joined):
        return joined  # the common case: no term holds a separator
    out: list[str] = []
    for term in text_terms:
        out.append(term)
        if _PART_SEPARATOR_RE.search(term):
            out.extend(p for p in _PART_SEPARATOR_RE.split(term) if p)
    return " ".join(out)


def match_terms(query_terms: Iterable[str]) -> set[str]:
    """The terms a text must share with a query to match it: its words, numbers and CJK bigrams,
    its single characters only when it has nothing longer. A lone shared character is chance in
    Chinese (住 of 记住 is not 住 of 住在), as a shared letter is in English (the "s" of
    "company's" is not the "s" of "It's")."""
    every = set(query_terms)
    return {t for t in every if len(t) > 1 or t.isdigit()} or every


def term_set(text: str) -> frozenset[str]:
    """The `match_terms` of a text (what two texts share when they say the same: `remember`'s
    dedup, recall's near-duplicates)."""
    return frozenset(match_terms(terms(unicodedata.normalize("NFKC", text))))


# Code points that belong to the character before them: combining marks (a decomposed "é" is
# "e" + U+0301), variation selectors and the zero-width joiner of emoji sequences.
_JOINERS = frozenset("\u200d\ufe0e\ufe0f")


def _joins_previous(char: str) -> bool:
    return unicodedata.combining(char) > 0 or char in _JOINERS or unicodedata.category(char) == "Mn"


def _is_word_char(char: str) -> bool:
    return char.isalnum() and not is_cjk(char)


def shorten(text: str, max_chars: int, mark: str = "…") -> str:
    """`text` if it has at most `max_chars` characters, else a prefix ending `mark` that fits,
    cut between words and never inside one character as a reader sees it (a letter and its
    combining accents, an emoji sequence). Between two CJK characters is a boundary; a word of
    another script longer than the room is cut at the grapheme boundary before the limit."""
    if len(text) <= max_chars:
        return text
    end = max(max_chars - len(mark), 0)
    while 0 < end < len(text) and (_joins_previous(text[end]) or text[end - 1] in _JOINERS):
        end -= 1
    cut = end
    if 0 < cut < len(text) and _is_word_char(text[cut - 1]) and _is_word_char(text[cut]):
        while cut > 0 and not (text[cut - 1].isspace() or not _is_word_char(text[cut - 1])):
            cut -= 1
        if cut == 0:  # a single word longer than the room: keep its graphemes that fit
            cut = end
    return text[:cut].rstrip() + mark
