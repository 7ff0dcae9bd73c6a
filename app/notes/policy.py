"""Pure notes policy: merge with supersede, the token cap, the prompt block, forgetting sources.

Merge rule: within one section, of the items sharing a `subject` only the latest survives ("last
wins": higher seq, and on a tie or a missing seq the item from `new`). Items whose normalised text
is identical collapse to the first occurrence. Output is ordered by seq (items without one last).

Cap rule: the rendered block must fit `max_tokens`; items go one at a time, oldest first within a
section, sections in `DROP_ORDER` — constraints last, because hard limits and user negations are
what a continuing task must never lose.
"""

import re

from app.core.tokens import count_tokens
from app.notes.schemas import NoteItem, Notes, NotesResult, SectionName

DROP_ORDER: tuple[SectionName, ...] = (
    "done",
    "facts",
    "open",
    "decisions",
    "goal",
    "remembered",
    "constraints",
)
DEFAULT_MAX_TOKENS = 400
_SPACE_RE = re.compile(r"\s+")


def _seq_key(item: NoteItem) -> float:
    return float("inf") if item.seq is None else float(item.seq)


def _text_key(item: NoteItem) -> str:
    return _SPACE_RE.sub(" ", item.text).strip().casefold()


def merge_items(items: list[NoteItem]) -> list[NoteItem]:
    """Supersede by subject, collapse duplicates, order by seq; `items` is in arrival order."""
    ordered = sorted(enumerate(items), key=lambda pair: (_seq_key(pair[1]), pair[0]))
    latest: dict[str, int] = {}
    for position, (_, item) in enumerate(ordered):
        if item.subject:
            latest[item.subject] = position
    kept: list[NoteItem] = []
    seen: set[str] = set()
    for position, (_, item) in enumerate(ordered):
        if item.subject and latest[item.subject] != position:
            continue
        key = _text_key(item)
        if key in seen:
            continue
        seen.add(key)
        kept.append(item)
    return kept


def merge(previous: Notes, new: Notes) -> Notes:
    """Fold `new` into `previous`: later items replace earlier ones with the same subject."""
    merged = Notes()
    for name, items in previous.sections():
        merged = merged.with_section(name, merge_items([*items, *new.section(name)]))
    return merged


def _label(item: NoteItem) -> str:
    if item.source == "memory":
        return "(remembered, model-written)"
    parts: list[str] = []
    if item.seq is not None:
        parts.append(f"turn {item.seq}")
    if item.source == "tool" or not item.trusted:
        parts.append("untrusted tool output")
    elif item.source == "assistant":
        parts.append("said by assistant")
    return f"({', '.join(parts)})" if parts else ""


def render_notes_block(notes: Notes) -> str:
    """The model-readable notes block: one `[section]` header, then one `- text (label)` line per
    item; empty sections are omitted and empty notes render as ""."""
    lines: list[str] = []
    for name, items in notes.sections():
        if not items:
            continue
        lines.append(f"[{name}]")
        for item in items:
            label = _label(item)
            text = _SPACE_RE.sub(" ", item.text).strip()
            lines.append(f"- {text} {label}" if label else f"- {text}")
    return "\n".join(lines)


def notes_tokens(notes: Notes) -> int:
    return count_tokens(render_notes_block(notes))


def cap(
    notes: Notes, max_tokens: int = DEFAULT_MAX_TOKENS, generator: str = "rules"
) -> NotesResult:
    """Drop items (in `DROP_ORDER`, oldest first) until the rendered block fits `max_tokens`."""
    current = notes
    dropped: list[NoteItem] = []
    tokens = notes_tokens(current)
    for name in DROP_ORDER:
        while tokens > max_tokens and current.section(name):
            items = current.section(name)
            oldest = min(range(len(items)), key=lambda i: (_seq_key(items[i]), i))
            dropped.append(items[oldest])
            current = current.with_section(name, items[:oldest] + items[oldest + 1 :])
            tokens = notes_tokens(current)
        if tokens <= max_tokens:
            break
    return NotesResult(notes=current, token_count=tokens, dropped=dropped, generator=generator)


def remove_sources(notes: Notes, seqs: set[int]) -> Notes:
    """Notes without the items whose source turns were forgotten."""
    cleaned = notes
    for name, items in notes.sections():
        cleaned = cleaned.with_section(
            name, [item for item in items if item.seq is None or item.seq not in seqs]
        )
    return cleaned
