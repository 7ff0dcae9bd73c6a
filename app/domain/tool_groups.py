"""Which call each tool result answers (pure): the one rule that pairs them everywhere — in the
prompt, in what an offload moves together and in what a forget widens to."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


def call_name(call: dict[str, Any]) -> str:
    """The function a tool call names (OpenAI's shape), "tool" when it names none."""
    return str((call.get("function") or {}).get("name") or "tool")


def result_tool(turns: Sequence[TurnRecord], at: int) -> str:
    """The tool whose result `turns[at]` is: its own `name`, else the call it answers."""
    pair = tool_pairs(turns).get(at)
    if turns[at].name or pair is None:
        return turns[at].name or "tool"
    i, j = pair
    return call_name((turns[i].tool_calls or [])[j])


def tool_names(turns: Sequence[TurnRecord]) -> dict[int, str]:
    """The seq of each tool result -> the tool that gave it, as `result_tool` names it (its own
    `name`, else the call it answers), in one pass; a result with neither is left out."""
    pairs = tool_pairs(turns)
    return {
        turn.seq: turn.name or call_name((turns[pairs[at][0]].tool_calls or [])[pairs[at][1]])
        for at, turn in enumerate(turns)
        if turn.role == "tool" and (turn.name or at in pairs)
    }


@dataclass(frozen=True, slots=True)
class ToolCallTally:
    """How often the session's live turns issued a tool call id, and answered it."""

    calls: int = 0
    results: int = 0


def atomic_units(turns: Sequence[TurnRecord]) -> list[range]:
    """Split `turns` into consecutive index ranges that must move (or chunk) together.

    A unit is one turn, or an assistant turn with `tool_calls` through the last tool turn answering
    one of its calls (`tool_pairs`: a reused call id is answered by its latest call, so one reused
    id does not tie the whole session together). Turns in between ride along; overlapping groups
    are merged. Tool results whose call is not in `turns` are single-turn units.
    """
    ends = list(range(len(turns)))  # ends[i]: last index that must stay with turn i
    for answered_at, (i, _) in tool_pairs(turns).items():
        ends[i] = max(ends[i], answered_at)
    units: list[range] = []
    start, reach = 0, -1
    for i in range(len(turns)):
        reach = max(reach, ends[i])
        if i == reach:
            units.append(range(start, i + 1))
            start = i + 1
    return units


def tool_groups(turns: Sequence[TurnRecord]) -> list[list[TurnRecord]]:
    """Split turns into the smallest contiguous groups that never separate a call from a result.

    A cut before turn i is allowed only if no turn at or after i answers a call made before i
    (`tool_pairs`).
    """
    if not any(turn.role == "tool" for turn in turns):
        return [[turn] for turn in turns]  # nothing answers a call: every cut is allowed
    pairs = tool_pairs(turns)
    needs = [pairs[i][0] if i in pairs else i for i in range(len(turns))]
    groups: list[list[TurnRecord]] = []
    end, lowest = len(turns), len(turns)
    for i in range(len(turns) - 1, -1, -1):
        lowest = min(lowest, needs[i])
        if lowest >= i:
            groups.append(list(turns[i:end]))
            end = i
    groups.reverse()
    return groups
