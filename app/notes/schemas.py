"""Notes (C2 scratchpad) value types: the JSON stored in `scratchpads.notes` and sent to the LLM.

`NoteItem.subject` is the normalised key that lets a later item replace an earlier one in the same
section (a corrected budget, a changed decision); items without a subject are only de-duplicated.
"""

from collections.abc import Iterator
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Source = Literal["user", "assistant", "tool", "memory", "system"]
SectionName = Literal["goal", "done", "open", "constraints", "decisions", "facts", "remembered"]
SECTION_NAMES: tuple[SectionName, ...] = (
    "goal",
    "done",
    "open",
    "constraints",
    "decisions",
    "facts",
    "remembered",
)


Generator = Literal["rules", "llm"]


class NoteItem(BaseModel):
    """One line of notes and its provenance: the turn it came from (`seq`, None for memory
    items) and any other turn it was built from (`seqs`), who said it (`source`), the tool of a
    tool result, and the generator that wrote the line. A line built from any untrusted part is
    untrusted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = Field(min_length=1)
    seq: int | None = None
    subject: str | None = None
    source: Source
    trusted: bool = True
    seqs: tuple[int, ...] = Field(
        (), description="other turns it was built from (the proposal a user confirmed)"
    )
    tool: str | None = Field(None, description="the tool whose result it came from")
    generator: Generator | None = Field(
        None, description="rules or llm; null for remembered items and lines written before"
    )
    valid_until: datetime | None = Field(
        None, description="a remembered item's end (its valid_until or TTL): out of prompts then"
    )

    def source_seqs(self) -> set[int]:
        """Every turn the line was built from: forgetting any of them takes the line."""
        return {*(() if self.seq is None else (self.seq,)), *self.seqs}


class Notes(BaseModel):
    """Structured notes: every section is an ordered list of items (oldest first)."""

    model_config = ConfigDict(extra="forbid")

    goal: list[NoteItem] = Field(default_factory=list)
    done: list[NoteItem] = Field(default_factory=list)
    open: list[NoteItem] = Field(default_factory=list)
    constraints: list[NoteItem] = Field(default_factory=list)
    decisions: list[NoteItem] = Field(default_factory=list)
    facts: list[NoteItem] = Field(default_factory=list)
    remembered: list[NoteItem] = Field(default_factory=list)

    def section(self, name: SectionName) -> list[NoteItem]:
        items: list[NoteItem] = getattr(self, name)
        return items

    def sections(self) -> Iterator[tuple[SectionName, list[NoteItem]]]:
        """(name, items) for every section, in template order, empty ones included."""
        for name in SECTION_NAMES:
            yield name, self.section(name)

    def items(self) -> list[NoteItem]:
        return [item for _, items in self.sections() for item in items]

    def is_empty(self) -> bool:
        return not any(items for _, items in self.sections())

    def with_section(self, name: SectionName, items: list[NoteItem]) -> "Notes":
        """A copy with one section replaced (notes are treated as values)."""
        return self.model_copy(update={name: list(items)})

    def lapses_by(self, at: datetime) -> bool:
        """Whether a line's validity ended at or before `at`."""
        return any(i.valid_until is not None and i.valid_until <= at for i in self.items())

    def in_force(self, at: datetime) -> "Notes":
        """A copy without the lines whose validity ended by `at` (an expired remembered item
        leaves the prompt at once, not at the next notes version)."""
        kept = self
        for name, items in self.sections():
            lapsed = [i for i in items if i.valid_until is not None and i.valid_until <= at]
            if lapsed:
                kept = kept.with_section(name, [i for i in items if i not in lapsed])
        return kept

    def max_seq(self) -> int | None:
        """The newest source turn any item cites (None when no item cites a turn)."""
        seqs = [item.seq for item in self.items() if item.seq is not None]
        return max(seqs) if seqs else None


class DroppedNote(BaseModel):
    """An item the token cap left out: where it was and what it would have cost (no text: its
    source turn holds that)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    section: SectionName
    seq: int | None
    source: Source
    tokens: int = Field(description="tokens of its rendered line")


class NotesResult(BaseModel):
    """Notes fitted to a token cap, with what had to go and which generator produced them."""

    notes: Notes
    token_count: int
    dropped: list[DroppedNote] = Field(default_factory=list)
    generator: str
