"""What each fragment of a build was worth (`--ablate`, issue 37 item 7). Pure: no I/O.

A build's fragments are read from its manifest and messages: each section of the notes block
(`[facts]`, `[constraints]`, …), each recalled item, the user-memory block (`<about_user>`, the
user's remembered items, as one fragment) and the entity table (the value table of tool
results). Each is removed in turn and the build scored again.

How a fragment is removed: in process, from the build the server returned — there is no request
parameter that leaves one fragment out, and rebuilding with a smaller budget would change what
else the build chose. This is the simplest honest reading of "the same prompt without it":
- evidence recall without a recalled item is the coverage of the other recalled items and the
  window (`coverage_without`); the notes, user-memory and table fragments cover no evidence turn
  by the metric's definition (evidence is turns shown verbatim), so their evidence delta is 0
  and only the judged answer can say what they were worth;
- the prompt without a fragment (`without_fragment`, for the answering model) is the same message
  list with that text cut out: a notes section's lines; the user-memory block's or the entity
  table's message; a recalled item's lines in the recalled-history block (found by the text of
  the turns it shows), its id taken out of its stretch's header (a stretch whose items all go is
  dropped, a block left empty too). A stretch that loses its first or last item keeps its header's
  time and turn span: the server is not asked again, so nothing else of the prompt moves.
The tokens of a fragment are those the manifest charges (a notes section: its lines counted).
"""

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.domain.tokens import count_tokens
from app.notes.policy import NOTES_HEADER
from app.notes.values import table_header
from app.prompt.blocks import (
    ABOUT_USER_OPEN,
    CUT_MARK,
    ITEM_SEPARATOR,
    RECALL_CLOSE,
    RECALL_OPEN,
    short_id,
)

RECALLED_ITEM = "recalled item"
RECALLED_MEMORY = "recalled remembered item"
USER_MEMORY = "user-memory block"
ENTITY_TABLE = "entity table"
NOTES_KIND = "notes [{}]"
_TABLE_START = table_header(False).split(" (")[0]
_SECTION_RE = re.compile(r"^\[(\w+)\]$")
_HEADER_RE = re.compile(
    r"^\[(?P<ts>[^|\]]*) \| (?P<where>[^|\]]*) \| (?P<ids>[^|\]]*)\](?P<rest>.*)$"
)
_PREFIX_CHARS = 40  # a shown line is matched to its turn by this much of the turn's text


@dataclass(frozen=True)
class Fragment:
    """One removable part of a build: its kind, its manifest id (a notes section: its name),
    the tokens it cost and, for a recalled item, the seqs of the turns it shows."""

    kind: str
    id: str
    tokens: int
    seqs: tuple[int, ...] = ()


def _kind_of_block(content: str) -> str | None:
    if content.startswith(NOTES_HEADER):
        return "notes"
    if content.startswith(ABOUT_USER_OPEN):
        return USER_MEMORY
    if content.startswith(RECALL_OPEN):
        return "recalled"
    if content.startswith(_TABLE_START):
        return ENTITY_TABLE
    return None


def _block_index(messages: Sequence[Mapping[str, Any]], kind: str) -> int | None:
    for n, m in enumerate(messages):
        content = m.get("content")
        if (
            m.get("role") == "system"
            and isinstance(content, str)
            and _kind_of_block(content) == kind
        ):
            return n
    return None


def notes_sections(notes: str) -> dict[str, list[str]]:
    """The notes block's sections: name → its lines (the `[name]` line first)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in notes.split("\n")[1:]:
        match = _SECTION_RE.match(line)
        if match:
            current = sections.setdefault(match.group(1), [])
        if current is not None:
            current.append(line)
    return sections


def item_seqs(item: Mapping[str, Any]) -> tuple[int, ...]:
    """The seqs of the turns a response's recalled item shows."""
    if item.get("turns") is not None:
        return tuple(int(s) for s in item["turns"])
    rng = item.get("turn_range")
    return tuple(range(int(rng[0]), int(rng[1]) + 1)) if rng else ()


def fragments(resp: Mapping[str, Any]) -> list[Fragment]:
    """Every fragment the build included, in prompt order."""
    messages = resp["messages"]
    out: list[Fragment] = []
    notes_at = _block_index(messages, "notes")
    if notes_at is not None:
        for name, lines in notes_sections(messages[notes_at]["content"]).items():
            out.append(Fragment(NOTES_KIND.format(name), name, count_tokens("\n".join(lines))))
    included = [e for e in resp["manifest"] if e["included"]]
    about = [e for e in included if e["layer"] == "c2" and e["source"] == "user_memory"]
    if about:
        out.append(Fragment(USER_MEMORY, "about_user", sum(int(e["tokens"]) for e in about)))
    items = {item["chunk_id"]: item for item in resp["recall"]["items"]}
    for e in included:
        if e["layer"] == "c3" and e["id"] in items:
            kind = RECALLED_MEMORY if items[e["id"]]["source"] == "memory" else RECALLED_ITEM
            out.append(Fragment(kind, e["id"], int(e["tokens"]), item_seqs(items[e["id"]])))
    out += [
        Fragment(ENTITY_TABLE, "values", int(e["tokens"])) for e in included if e["id"] == "values"
    ]
    return out


def coverage_without(
    evidence: Sequence[str],
    units: Mapping[str, set[str]],
    window: set[str],
    removed: str | None,
) -> float:
    """Evidence recall of a build whose recalled items cover `units` (id → dia_ids) and whose
    window covers `window`, without the item `removed` (None: the whole build)."""
    if not evidence:
        return 0.0
    covered = set(window).union(*(dias for item, dias in units.items() if item != removed))
    return sum(1 for e in evidence if e in covered) / len(evidence)


def without_fragment(
    messages: Sequence[Mapping[str, Any]], fragment: Fragment, shown_lines: Mapping[int, str]
) -> list[dict[str, Any]]:
    """The messages with `fragment` cut out (see the module's docstring). `shown_lines`: seq →
    the line a recalled item shows for that turn (`role: content`)."""
    out = [dict(m) for m in messages]
    if fragment.kind in (USER_MEMORY, ENTITY_TABLE):
        at = _block_index(out, fragment.kind)
        return out if at is None else out[:at] + out[at + 1 :]
    if fragment.kind.startswith("notes"):
        at = _block_index(out, "notes")
        if at is None:
            return out
        sections = notes_sections(out[at]["content"])
        kept = [line for name, lines in sections.items() if name != fragment.id for line in lines]
        if not kept:
            return out[:at] + out[at + 1 :]
        out[at]["content"] = "\n".join([NOTES_HEADER, *kept])
        return out
    at = _block_index(out, "recalled")
    if at is None:
        return out
    block = _recalled_without(out[at]["content"], fragment, shown_lines)
    return (
        out[:at] + out[at + 1 :]
        if block is None
        else [*out[:at], {**out[at], "content": block}, *out[at + 1 :]]
    )


def _recalled_without(block: str, fragment: Fragment, shown_lines: Mapping[int, str]) -> str | None:
    """The recalled-history block without the item `fragment`; None when nothing is left."""
    body = block.removesuffix("\n" + RECALL_CLOSE)
    head, *pieces = body.split(ITEM_SEPARATOR + "[")
    stretches: list[str] = []
    for piece in pieces:  # a blank line inside an item's text followed by "[" is not a stretch
        if stretches and not _HEADER_RE.match("[" + piece.partition("\n")[0]):
            stretches[-1] += ITEM_SEPARATOR + "[" + piece
        else:
            stretches.append(piece)
    kept: list[str] = []
    gone = short_id(fragment.id)
    prefixes = [shown_lines[s][:_PREFIX_CHARS] for s in fragment.seqs if s in shown_lines]
    for raw in stretches:
        stretch = "[" + raw
        header, _, text = stretch.partition("\n")
        match = _HEADER_RE.match(header)
        ids = match.group("ids").split() if match else []
        if gone not in ids:
            kept.append(stretch)
            continue
        if len(ids) == 1:
            continue
        lines = [line for line in text.split("\n") if not line.startswith(tuple(prefixes))]
        lines = _tidy_cut_marks(lines)
        if not lines:
            continue
        assert match is not None
        rest = [i for i in ids if i != gone]
        new_header = f"[{match.group('ts')} | {match.group('where')} | {' '.join(rest)}]"
        kept.append(new_header + match.group("rest") + "\n" + "\n".join(lines))
    if not kept:
        return None
    return ITEM_SEPARATOR.join([head, *kept]) + "\n" + RECALL_CLOSE


def _tidy_cut_marks(lines: list[str]) -> list[str]:
    """No gap mark at either end, nor two in a row, once lines are taken out."""
    out: list[str] = []
    for line in lines:
        if line == CUT_MARK and (not out or out[-1] == CUT_MARK):
            continue
        out.append(line)
    while out and out[-1] == CUT_MARK:
        out.pop()
    return out


@dataclass
class FragmentOutcome:
    """One fragment of one question's build, and what removing it changed."""

    kind: str
    tokens: int
    evidence_delta: float  # evidence recall of the build minus that without the fragment
    published_delta: int | None = None  # judged correct with it minus without (-1, 0, 1)
    strict_delta: int | None = None
    rank: int | None = None  # a recalled item's place in the build's recall order, from 1


@dataclass
class KindRow:
    kind: str
    fragments: int
    questions: int
    tokens_mean: float
    tokens_per_question: float
    evidence_delta_mean: float
    earned_evidence: float  # share of fragments whose removal lowered evidence recall
    earned_tokens: float  # share of the kind's tokens in those fragments
    published_delta_mean: float | None = None
    strict_delta_mean: float | None = None


def kind_rows(per_question: Sequence[Sequence[FragmentOutcome]]) -> list[KindRow]:
    """Per fragment kind, over every question's build: how many fragments, their mean tokens
    and tokens per question that had one, the mean evidence recall lost when one is removed and
    the share of them whose removal lost any (and of their tokens); with judged answers, the
    mean change of each judge's verdict (1: the answer was right only with the fragment)."""
    by_kind: dict[str, list[FragmentOutcome]] = {}
    questions: dict[str, int] = {}
    for outcomes in per_question:
        for kind in {o.kind for o in outcomes}:
            questions[kind] = questions.get(kind, 0) + 1
        for o in outcomes:
            by_kind.setdefault(o.kind, []).append(o)
    rows = []
    for kind, outcomes in by_kind.items():
        judged = [o for o in outcomes if o.published_delta is not None]
        tokens = sum(o.tokens for o in outcomes)
        rows.append(
            KindRow(
                kind=kind,
                fragments=len(outcomes),
                questions=questions[kind],
                tokens_mean=tokens / len(outcomes),
                tokens_per_question=tokens / questions[kind],
                evidence_delta_mean=statistics.fmean(o.evidence_delta for o in outcomes),
                earned_evidence=sum(o.evidence_delta > 0 for o in outcomes) / len(outcomes),
                earned_tokens=(
                    sum(o.tokens for o in outcomes if o.evidence_delta > 0) / tokens
                    if tokens
                    else 0.0
                ),
                published_delta_mean=(
                    statistics.fmean(o.published_delta or 0 for o in judged) if judged else None
                ),
                strict_delta_mean=(
                    statistics.fmean(o.strict_delta or 0 for o in judged) if judged else None
                ),
            )
        )
    return sorted(rows, key=lambda r: (not r.kind.startswith("notes"), r.kind))


RANK_BUCKETS = ((1, 1), (2, 2), (3, 3), (4, 5), (6, 8), (9, 12), (13, 10_000))


def rank_rows(per_question: Sequence[Sequence[FragmentOutcome]]) -> list[KindRow]:
    """`kind_rows` of the recalled items by their place in the recall order (1, 2, 3, 4-5, 6-8,
    9-12, 13+): whether the items packed last earn their tokens as the first ones do."""

    def bucket(rank: int) -> str:
        low, high = next((lo, hi) for lo, hi in RANK_BUCKETS if lo <= rank <= hi)
        span = str(low) if low == high else f"{low}+" if high == 10_000 else f"{low}-{high}"
        return f"recalled item, rank {span}"

    relabelled = [
        [replace(o, kind=bucket(o.rank)) for o in outcomes if o.rank is not None]
        for outcomes in per_question
    ]
    rows = kind_rows(relabelled)
    order = {bucket(lo): n for n, (lo, _) in enumerate(RANK_BUCKETS)}
    return sorted(rows, key=lambda r: order[r.kind])
