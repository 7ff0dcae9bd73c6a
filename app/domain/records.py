"""Plain value types shared across domains (no ORM, no I/O): what the pure policy modules see."""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One stored conversation turn as the policy code sees it.

    `token_count` is the prompt cost of the turn as a message, framing included
    (see `app.domain.tokens.message_tokens`).
    """

    seq: int
    role: str  # user | assistant | tool | system
    content: str
    token_count: int
    created_at: datetime
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # Its source was marked untrusted after the fact (`POST .../sources/untrust`).
    quarantined: bool = False

    @property
    def trusted(self) -> bool:
        """Tool output is data from outside the conversation: it stays labelled untrusted, as
        does any turn whose source was marked untrusted."""
        return self.role != "tool" and not self.quarantined


def untrusted_roles(turns: Iterable[TurnRecord]) -> tuple[str, ...]:
    """The roles of the untrusted turns among `turns`, sorted, each once: what a label of text
    made from them says it is (tool output, or a turn of that role from a source marked
    untrusted)."""
    return tuple(sorted({turn.role for turn in turns if not turn.trusted}))


@dataclass(frozen=True, slots=True)
class RecalledItem:
    """One recalled fragment, in rank order as the recall chain returns it.

    `chunk_id` is the chunk id, or the memory id for a remembered item (then `source="memory"`
    and the turn range may be None). `trusted` is False for text that came from tool output or
    from a turn whose source was marked untrusted; `untrusted_roles` says which (a chunk's: the
    roles of its untrusted turns; empty for a remembered item).
    """

    chunk_id: str
    text: str
    ts: datetime
    turn_first: int | None = None
    turn_last: int | None = None
    trusted: bool = True
    score: float | None = None
    source: str = "chunk"
    # The turns the text shows when it is cut down to some of the range's turns (None: all).
    seqs: tuple[int, ...] | None = None
    # A shorter version (the turns that answer the query), used when the whole does not fit.
    compact: "RecalledItem | None" = None
    # `count_tokens(text)` when already known (a chunk's stored count): not encoded again.
    text_tokens: int | None = None
    untrusted_roles: tuple[str, ...] = ()
