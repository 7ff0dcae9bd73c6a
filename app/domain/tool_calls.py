"""Which call each tool result answers (pure): the one rule that pairs them everywhere — in the
prompt, in what an offload moves together and in what a forget widens to."""

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.records import TurnRecord


def tool_pairs(turns: Sequence[TurnRecord]) -> dict[int, tuple[int, int]]:
    """Result position -> (position of the assistant turn, position of the call in its
    `tool_calls`). A result answers the latest earlier call with its id that has no result yet:
    agents and local model servers reuse ids such as `call_0` for later calls. A result with no
    such call is in no pair."""
    waiting: dict[str, list[tuple[int, int]]] = {}  # call id -> unanswered calls, oldest first
    pairs: dict[int, tuple[int, int]] = {}
    for i, turn in enumerate(turns):
        if turn.role == "assistant":
            for j, call in enumerate(turn.tool_calls or []):
                waiting.setdefault(str(call.get("id")), []).append((i, j))
        elif turn.role == "tool":
            calls = waiting.get(turn.tool_call_id or "")
            if calls:
                pairs[i] = calls.pop()
    return pairs


@dataclass(frozen=True, slots=True)
class ToolCallTally:
    """How often the session's live turns issued a tool call id, and answered it."""

    calls: int = 0
    results: int = 0
