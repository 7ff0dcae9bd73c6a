"""Chunking of offloaded turns into raw-text C3 chunks (pure, no I/O).

Coverage contract: every input turn is covered by exactly one chunk, except a turn longer than
`max_tokens`, which is covered by its pieces (`part` 1..`parts`, all with `turn_first == turn_last`
== its seq, no other turn). A piece's raw_text is
`"{label} [part i/n]:\\n" + overlap_prefix + piece`, where `overlap_prefix` (empty on part 1) is a
copy of the end of the previous piece; the pieces joined give back `turn_body(turn)` (the content
verbatim, then its tool-calls line if any).

Token bounds: `token_count <= max_tokens` (pieces budget for their header and overlap; text with
no paragraph or sentence edge is hard-cut on a token edge), except a tool-call group, below.
A chunk is below `min_tokens` only when it ends the input, ends before a time gap, is followed by
a unit that did not fit under `max_tokens`, or is the last piece of a split turn.
A tool call and its results always share one chunk, even past `max_tokens`; only when one of
their turns is itself longer than `max_tokens` (and must be split) is the group chunked turn by
turn (still in order, still contiguous).

Where a long turn's body is cut, and how its pieces' tokens are counted, is `app.offload.cuts`.
"""

import re
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from itertools import chain

from app.core.config import Settings
from app.domain.dates import date_terms, said_at
from app.domain.records import TurnRecord, untrusted_roles
from app.domain.text import shorten, terms, terms_document
from app.domain.tokens import (
    count_tokens,
    framing_tokens,
    short_tokens,
    spaced_tokens,
)
from app.domain.tool_groups import atomic_units
from app.domain.turn_text import render_turn, turn_body, turn_label
from app.offload.cuts import TokenisedBody, place_cuts, raw_tokens

DEFAULT_CHUNK_MIN_TOKENS = 60
DEFAULT_CHUNK_MAX_TOKENS = 160
DEFAULT_SPLIT_OVERLAP_TOKENS = 20
DEFAULT_TIME_GAP_SECONDS = 30 * 60
# Jaccard of terms() between neighbouring turns. On LoCoMo neighbours score median 0.061, 27% share
# no term. At 0.08 (~60th percentile) the chunker's mean chunk on the 7 dev conversations is 97
# tokens (0.05: 108, 0.15: 82), i.e. the ~100-token unit that ranked best at 500-1000 tokens.
DEFAULT_TOPIC_SHIFT_THRESHOLD = 0.08
SUMMARY_HINT_MAX_CHARS = 80

# An ID needs a digit and an email an "@", and every match lies inside one run of [\w.+@-]: the
# patterns below run only on such runs that hold a digit or "@" (found from the run's start, so
# linear), and not on runs longer than `_MAX_ID_RUN` (no label is 16 KB long) — on a long run
# they backtrack from every start, quadratic in its length.
_ID_RUN_RE = re.compile(r"(?<![\w.+@-])[\w.+@-]*[\d@][\w.+@-]*")
_ID_MARK_RE = re.compile(r"[\d@]")  # text without one holds no ID nor email
_MAX_ID_RUN = 200
_ID_RE = re.compile(
    r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # emails
    r"|\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*\b"  # IDs: letters + digits
)
# A word of letters (any script's: "Musée", "Fourvière", "Saône" whole, not cut at the first
# accented letter); names are the capitalised ones, see `_names`.
# Combining marks count with their letter (a decomposed "é" is "e" + U+0301, which is no \w).
_LETTERS_RE = re.compile(r"(?:[^\W\d_][\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff]*)+")
_SENTENCE_END = frozenset(".!?:;\n")
_CLAUSE_RE = re.compile(r"[,.;:!?，。；：！？\n]")


@dataclass(frozen=True, slots=True)
class ChunkingConfig:
    min_tokens: int = DEFAULT_CHUNK_MIN_TOKENS
    max_tokens: int = DEFAULT_CHUNK_MAX_TOKENS
    split_overlap_tokens: int = DEFAULT_SPLIT_OVERLAP_TOKENS
    time_gap_seconds: float = DEFAULT_TIME_GAP_SECONDS
    topic_shift_threshold: float = DEFAULT_TOPIC_SHIFT_THRESHOLD

    def __post_init__(self) -> None:
        if not 0 < self.min_tokens <= self.max_tokens:
            raise ValueError("min_tokens must satisfy 0 < min_tokens <= max_tokens")
        if not 0 <= self.split_overlap_tokens <= self.max_tokens // 4:
            raise ValueError("split_overlap_tokens must be between 0 and max_tokens // 4")
        if self.time_gap_seconds <= 0:
            raise ValueError("time_gap_seconds must be > 0")
        if not 0 <= self.topic_shift_threshold <= 1:
            raise ValueError("topic_shift_threshold must be between 0 and 1")


@dataclass(frozen=True, slots=True)
class ChunkDraft:
    """One chunk to write; `raw_text` holds each covered turn verbatim, role-labelled."""

    turn_first: int
    turn_last: int
    roles: tuple[str, ...]  # sorted, distinct
    ts_first: datetime
    ts_last: datetime
    raw_text: str
    summary_hint: str
    token_count: int
    # The roles of its untrusted turns (tool output, a turn from a source marked untrusted).
    untrusted_roles: tuple[str, ...]
    terms: tuple[str, ...]  # terms(raw_text)
    part: int = 1  # 1-based piece index of a split turn
    parts: int = 1  # number of pieces of that turn; 1 for ordinary chunks
    overlap_prefix: str = ""  # start of the piece body copied from the previous piece
    overlap_tokens: int = 0  # count_tokens(overlap_prefix)

    @property
    def trusted(self) -> bool:
        return not self.untrusted_roles

    @property
    def is_piece(self) -> bool:
        return self.parts > 1


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard similarity of two turns' `terms()` sets; 1.0 when either side has no terms."""
    if not a or not b:
        return 1.0
    return len(a & b) / len(a | b)


def summary_hint(turns: Sequence[TurnRecord]) -> str:
    """A short label: salient IDs, emails and names, else the first clause of the first turn."""
    seen: dict[str, None] = {}
    for label in chain(_ids(turns), (n for t in turns for n in _names(t.content))):
        if label not in seen:
            seen[label] = None
            # `shorten` reads the first SUMMARY_HINT_MAX_CHARS + 1 characters: the rest of a
            # megabyte log is not searched.
            if sum(map(len, seen)) + 2 * (len(seen) - 1) > SUMMARY_HINT_MAX_CHARS:
                break
    text = ", ".join(seen)
    if not text:
        first = next((t.content for t in turns if t.content.strip()), turn_body(turns[0]))
        text = next((c.strip() for c in _CLAUSE_RE.split(first) if c.strip()), "")
    return shorten(text, SUMMARY_HINT_MAX_CHARS)


def _ids(turns: Sequence[TurnRecord]) -> Iterator[str]:
    """IDs and emails of `turns`, in order (repeats included)."""
    for turn in turns:
        if not _ID_MARK_RE.search(turn.content):
            continue
        for run in _ID_RUN_RE.finditer(turn.content):
            if len(run.group(0)) <= _MAX_ID_RUN:
                for match in _ID_RE.finditer(run.group(0)):
                    yield match.group(0)


def _capitalised(word: str) -> bool:
    return len(word) > 1 and word[0].isupper() and word[1:].islower()


def _opens_sentence(text: str, start: int) -> bool:
    """The word at `start` begins the text, a line or a sentence, or is glued to what precedes
    it (`McGee`'s "Gee", `3Bob`): a capital there says nothing about a name."""
    if start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        return True
    before = start - 1
    while before >= 0 and text[before] in " \t":
        before -= 1
    return before < 0 or text[before] in _SENTENCE_END


def _names(text: str) -> Iterator[str]:
    """Runs of capitalised words (one space between them) not at the start of the text, of a
    line or of a sentence: "Musée des Confluences" gives "Musée", "Confluences"."""
    run: list[str] = []
    run_end = -1
    for match in _LETTERS_RE.finditer(text):
        word, start = match.group(0), match.start()
        if run and start == run_end + 1 and text[run_end].isspace() and _capitalised(word):
            run.append(word)
            run_end = match.end()
            continue
        if run:
            yield " ".join(run)
            run = []
        if _capitalised(word) and not _opens_sentence(text, start):
            run, run_end = [word], match.end()
    if run:
        yield " ".join(run)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """What the chunker needs of one turn, computed once: its text in a chunk, that text's
    tokens, the tokens a newline after it adds when another turn follows, its terms and when it
    was said."""

    turn: TurnRecord
    text: str
    tokens: int
    join: int
    terms: list[str]  # terms(text)
    content_terms: frozenset[str]  # terms(turn.content), for the topic-shift test
    said: datetime


def _join_tokens(text: str) -> int:
    """Tokens that `text + "\n" + next` holds beyond `text` and `next` apart, for any `next`
    starting with a letter (every rendered turn starts with its role).

    cl100k splits text into pieces before BPE, and a piece never spans a letter or digit
    followed by anything else, nor (for a `next` starting with a letter) the newline and `next`.
    So the newline can only merge into the trailing run of `text` that holds no letter or digit:
    counting that run with and without the newline is exact."""
    start = len(text)
    while start and not text[start - 1].isalnum():
        start -= 1
    return _newline_tokens(text[start:])


@lru_cache(maxsize=4096)
def _newline_tokens(tail: str) -> int:
    """Tokens a newline adds after `tail` (a trailing run of punctuation and spaces)."""
    return count_tokens(tail + "\n") - count_tokens(tail)


def _prepare(turn: TurnRecord, label_terms: dict[str, list[str]], max_tokens: int) -> _Prepared:
    text = render_turn(turn)
    said = said_at(turn.metadata, turn.created_at)
    # `render_turn`: "label: content", then "\nrole → tool_calls: ..." for a tool call.
    prefix = f"{turn_label(turn)}: "
    rest = text[len(prefix) + len(turn.content) :] if turn.content else None
    if turn.content and not rest:
        # cl100k always cuts after the label's colon (a space follows it), and the stored
        # count holds the content's tokens: only the content's first word is counted again.
        content = turn.token_count - framing_tokens(turn.role, turn.name, turn.tool_call_id)
        tokens = short_tokens(prefix[:-1]) + spaced_tokens(turn.content, content)
    else:
        tokens = count_tokens(text)
    if tokens > max_tokens:
        # The turn is split into pieces with terms of their own (`_split_turn`): the whole
        # turn's would never be used (on megabytes of text, seconds).
        return _Prepared(turn, text, tokens, _join_tokens(text), [], frozenset(), said)
    content_terms = terms(turn.content)
    if turn.content:
        # Terms never span the ": " nor the newline, so the text's terms are the parts' (the
        # label's computed once per label).
        if prefix not in label_terms:
            label_terms[prefix] = terms(prefix)
        text_terms = [*label_terms[prefix], *content_terms, *(terms(rest) if rest else ())]
    else:
        text_terms = terms(text)
    return _Prepared(
        turn=turn,
        text=text,
        tokens=tokens,
        join=_join_tokens(text),
        terms=text_terms,
        content_terms=frozenset(content_terms),
        said=said,
    )


def _tokens(unit: Sequence[_Prepared]) -> int:
    """Tokens of the unit's texts joined by newlines (`_join_tokens`: no re-tokenising)."""
    return sum(p.tokens for p in unit) + sum(p.join for p in unit[:-1])


def chunk_turns(turns: Sequence[TurnRecord], cfg: ChunkingConfig | None = None) -> list[ChunkDraft]:
    """Group consecutive turns (in seq order) into chunks; the rules are in the module docstring."""
    return list(iter_chunks(turns, cfg))


def iter_chunks(
    turns: Sequence[TurnRecord], cfg: ChunkingConfig | None = None
) -> Iterator[ChunkDraft]:
    """`chunk_turns`, chunk by chunk as the turns are read.

    Each turn is rendered and split into terms once, and its tokens come from its stored count
    (`_prepare`); a chunk's token count and terms are its turns' (`_join_tokens`), so the cost is
    linear in the text however turns group."""
    cfg = cfg or ChunkingConfig()
    label_terms: dict[str, list[str]] = {}
    current: list[_Prepared] = []
    current_tokens = 0
    for indices in atomic_units(turns):
        group = [_prepare(turns[i], label_terms, cfg.max_tokens) for i in indices]
        # A tool call stays in one chunk with its results even past max_tokens (spec §2); only
        # when one of its turns must itself be split does the group fall apart turn by turn.
        if len(group) > 1 and any(p.tokens > cfg.max_tokens for p in group):
            units = [[p] for p in group]
        else:
            units = [group]
        for unit in units:
            if len(unit) == 1 and unit[0].tokens > cfg.max_tokens:
                if current:
                    yield _group_draft(current, current_tokens)
                    current = []
                yield from TurnPieces(unit[0].turn, cfg)
                continue
            unit_tokens = _tokens(unit)
            joined = current_tokens + current[-1].join + unit_tokens if current else unit_tokens
            if current and _breaks(current, current_tokens, unit, joined, cfg):
                yield _group_draft(current, current_tokens)
                current, joined = [], unit_tokens
            current.extend(unit)
            current_tokens = joined
    if current:
        yield _group_draft(current, current_tokens)


def _breaks(
    current: list[_Prepared],
    current_tokens: int,
    unit: list[_Prepared],
    joined_tokens: int,
    cfg: ChunkingConfig,
) -> bool:
    last, nxt = current[-1], unit[0]
    if (nxt.said - last.said).total_seconds() > cfg.time_gap_seconds:
        return True
    if joined_tokens > cfg.max_tokens:
        return True
    return (
        current_tokens >= cfg.min_tokens
        and jaccard(last.content_terms, nxt.content_terms) < cfg.topic_shift_threshold
    )


def _group_draft(group: Sequence[_Prepared], tokens: int) -> ChunkDraft:
    """The chunk of whole turns `group`, whose joined text holds `tokens` tokens."""
    turns = [p.turn for p in group]
    return ChunkDraft(
        turn_first=turns[0].seq,
        turn_last=turns[-1].seq,
        roles=tuple(sorted({t.role for t in turns})),
        ts_first=min(p.said for p in group),
        ts_last=max(p.said for p in group),
        raw_text="\n".join(p.text for p in group),
        summary_hint=summary_hint(turns),
        token_count=tokens,
        untrusted_roles=untrusted_roles(turns),
        terms=tuple(chain.from_iterable(p.terms for p in group)),
    )


def _draft(
    turn: TurnRecord, raw_text: str, hint: str, token_count: int, **piece: object
) -> ChunkDraft:
    """A piece of the split `turn`."""
    said = said_at(turn.metadata, turn.created_at)
    return ChunkDraft(
        turn_first=turn.seq,
        turn_last=turn.seq,
        roles=(turn.role,),
        ts_first=said,
        ts_last=said,
        raw_text=raw_text,
        summary_hint=hint,
        token_count=token_count,
        untrusted_roles=untrusted_roles([turn]),
        terms=tuple(terms(raw_text)),
        **piece,  # type: ignore[arg-type]
    )


class TurnPieces:
    """The pieces of one turn longer than `cfg.max_tokens` (as `iter_chunks` splits it), each a
    `label [part i/n]:` header line, the overlap copy, then the piece. The cuts are placed at
    once (`len` is known); each piece is drafted as it is iterated (its terms are most of the
    work), so a writer stores some while the next are drafted. `body_ids`: the tokens of
    `turn_body(turn)` when the caller has them.

    Linear in the turn's length: the body is tokenised once (`place_cuts` places the cuts on that
    tokenisation), and a piece cut on line edges is counted from it (`raw_tokens`); only the
    short header and overlap are tokenised again, and pieces cut elsewhere."""

    def __init__(
        self, turn: TurnRecord, cfg: ChunkingConfig, body_ids: Sequence[int] | None = None
    ) -> None:
        self.turn = turn
        self.cfg = cfg
        self.label = turn_label(turn)
        header_budget = count_tokens(f"{self.label} [part 999/999]:\n") + 2
        budget = max(1, cfg.max_tokens - header_budget - cfg.split_overlap_tokens)
        self.body = TokenisedBody(turn_body(turn), body_ids)
        self.cuts = place_cuts(self.body, budget)
        self.hint = summary_hint([turn])

    def __len__(self) -> int:
        return len(self.cuts)

    def __iter__(self) -> Iterator[ChunkDraft]:
        cuts, cfg = self.cuts, self.cfg
        for i, (start, end, tokens) in enumerate(cuts):
            header = f"{self.label} [part {i + 1}/{len(cuts)}]:\n"
            piece = self.body.data[start:end].decode()
            overlap = (
                self.body.overlap(cuts[i - 1][0], start, cfg.split_overlap_tokens) if i else ""
            )
            while True:
                raw = f"{header}{overlap}{piece}"
                overlap_tokens = count_tokens(overlap)
                count = raw_tokens(header, overlap, overlap_tokens, piece, tokens)
                if count <= cfg.max_tokens or not overlap:
                    break
                overlap = overlap[len(overlap) // 4 or 1 :]  # a long header: less overlap
            yield _draft(
                self.turn,
                raw,
                self.hint,
                count,
                part=i + 1,
                parts=len(cuts),
                overlap_prefix=overlap,
                overlap_tokens=overlap_tokens,
            )


def joined_pieces(pieces: Sequence[tuple[str, int]]) -> str:
    """`turn_body` of a split turn from its pieces in order, each as (raw_text, characters of
    its overlap copy): each piece's text after its header line, less that copy."""
    return "".join(raw.split("\n", 1)[1][overlap:] for raw, overlap in pieces)


def chunking_config(settings: Settings) -> ChunkingConfig:
    o = settings.offload
    return ChunkingConfig(
        min_tokens=o.chunk_min_tokens,
        max_tokens=o.chunk_max_tokens,
        split_overlap_tokens=o.chunk_overlap_tokens,
        time_gap_seconds=o.chunk_time_gap_seconds,
        topic_shift_threshold=o.topic_shift_threshold,
    )


# The pieces of a split turn share their times: a 2 MB result's 6,000 rows format them once.
_isoformat = lru_cache(maxsize=256)(datetime.isoformat)


@lru_cache(maxsize=256)
def _date_terms(first: datetime, last: datetime) -> tuple[str, ...]:
    return tuple(date_terms(first, last))


def chunk_row(draft: ChunkDraft, chunk_id: uuid.UUID) -> dict[str, object]:
    """The row `app.store.chunks.insert_chunks` stores for `draft`: ids and times as
    strings, which is how JSON carries them to PostgreSQL."""
    counts = Counter(draft.terms)
    # The tsvector holds each term once: it only serves matches (`@@`), which positions and
    # repeats do not change, and the parser's cost follows the text it reads.
    lexical = terms_document(list(counts))
    # The chunk's days and months are search terms too ("in May", "last week": app.domain.dates).
    dates = _date_terms(draft.ts_first, draft.ts_last)
    counts.update(dates)
    return {
        "id": str(chunk_id),
        "turn_first": draft.turn_first,
        "turn_last": draft.turn_last,
        "part": draft.part,
        "parts": draft.parts,
        "overlap_tokens": draft.overlap_tokens,
        "overlap_chars": len(draft.overlap_prefix),
        "roles": list(draft.roles),
        "ts_first": _isoformat(draft.ts_first),
        "ts_last": _isoformat(draft.ts_last),
        "raw_text": draft.raw_text,
        "summary_hint": draft.summary_hint[:200],
        "token_count": draft.token_count,
        "term_counts": dict(counts),
        "term_total": len(draft.terms) + len(dates),
        "lexical_source": " ".join([lexical, *dates]),
        "trusted": draft.trusted,
        "untrusted_roles": list(draft.untrusted_roles),
    }
