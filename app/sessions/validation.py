"""The checks of an append that need no database: sizes against the limits, tool-call ids and
which tool results the session's stored calls must answer. Pure: a 4xx names the field."""

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from app.core.config import Settings
from app.core.errors import (
    DuplicateToolCallId,
    DuplicateToolResult,
    InvalidInput,
    MissingToolCallId,
    PayloadTooLarge,
    UnknownToolCall,
)
from app.domain.tool_groups import ToolCallTally
from app.http.input import json_size
from app.sessions.schemas import AppendTurnsRequest, TurnIn


def check_metadata_size(metadata: dict[str, Any] | None, field: str, settings: Settings) -> int:
    """The metadata's size as JSON; 413 above `limits.max_metadata_bytes`."""
    size = json_size(metadata) if metadata else 0
    if size > settings.limits.max_metadata_bytes:
        raise PayloadTooLarge(
            f"metadata is {size} bytes as JSON; the limit is {settings.limits.max_metadata_bytes}",
            field=field,
        )
    return size


def _check_turn_size(turn: TurnIn, field: str, settings: Settings) -> None:
    """Content, tool calls and metadata together within `limits.max_turn_bytes`, a tool result
    within `limits.max_tool_result_bytes` (413)."""
    parts = {
        "content": len((turn.content or "").encode()),
        "tool_calls": json_size([c.model_dump(mode="json") for c in turn.tool_calls])
        if turn.tool_calls
        else 0,
        "metadata": check_metadata_size(turn.metadata, f"{field}.metadata", settings),
    }
    limits = settings.limits
    size = sum(parts.values())
    limit, name = (
        (limits.max_tool_result_bytes, "limits.max_tool_result_bytes")
        if turn.role == "tool"
        else (limits.max_turn_bytes, "limits.max_turn_bytes")
    )
    if size > limit:
        largest = max(parts, key=lambda part: parts[part])
        raise PayloadTooLarge(
            f"turn is {size} bytes ({', '.join(f'{k} {v}' for k, v in parts.items() if v)}); "
            f"the limit ({name}) is {limit}",
            field=f"{field}.{largest}",
        )


def _unanswered_results(
    turns: Sequence[TurnIn], stored: Mapping[str, ToolCallTally]
) -> Iterator[tuple[int, str]]:
    """The tool results of `turns` (index, call id) that no call waiting for a result answers,
    after the session's stored calls and results (`stored`, by call id).

    A result answers the latest call with its id that has no result yet (`app.domain.tool_groups`):
    agents reuse ids such as `call_0`, so what counts is how many calls of an id still wait."""
    waiting = {i: max(0, tally.calls - tally.results) for i, tally in stored.items()}
    for index, turn in enumerate(turns):
        for call in turn.tool_calls or []:
            waiting[call.id] = waiting.get(call.id, 0) + 1
        call_id = turn.tool_call_id
        if turn.role != "tool" or call_id is None:
            continue
        if waiting.get(call_id, 0):
            waiting[call_id] -= 1
        else:
            yield index, call_id


def check_tool_results(turns: Sequence[TurnIn], stored: Mapping[str, ToolCallTally]) -> None:
    """422 for the first tool result that answers no call waiting for one: a duplicate when
    every call of its id has its result, else an unknown call."""
    first = next(_unanswered_results(turns, stored), None)
    if first is None:
        return
    index, call_id = first
    field = f"turns[{index}].tool_call_id"
    issued = call_id in stored and stored[call_id].calls > 0
    if issued or any(c.id == call_id for turn in turns[:index] for c in turn.tool_calls or []):
        raise DuplicateToolResult(
            f"every tool call {call_id!r} already has its result (one result per call)",
            field=field,
        )
    raise UnknownToolCall(f"no assistant turn issued tool call {call_id!r}", field=field)


def validate_batch(request: AppendTurnsRequest, settings: Settings) -> list[str]:
    """Checks that need no database. Returns the call ids of tool results that the request's
    own calls do not answer: those the session's stored calls must."""
    if len(request.turns) > settings.limits.max_turns_per_request:
        raise PayloadTooLarge(
            f"at most {settings.limits.max_turns_per_request} turns per request",
            field="turns",
        )
    for i, turn in enumerate(request.turns):
        _check_turn_size(turn, f"turns[{i}]", settings)
        if turn.role == "tool":
            if not turn.tool_call_id:
                raise MissingToolCallId(
                    "a tool turn needs the tool_call_id it answers",
                    field=f"turns[{i}].tool_call_id",
                )
        elif turn.tool_call_id:
            raise InvalidInput(
                "only tool turns carry a tool_call_id", field=f"turns[{i}].tool_call_id"
            )
        if turn.tool_calls:
            if turn.role != "assistant":
                raise InvalidInput(
                    "only assistant turns carry tool_calls", field=f"turns[{i}].tool_calls"
                )
            seen: set[str] = set()
            for j, call in enumerate(turn.tool_calls):
                if call.id in seen:
                    raise DuplicateToolCallId(
                        f"tool call id {call.id!r} is already used by another call of this "
                        "turn (ids are unique within one assistant turn)",
                        field=f"turns[{i}].tool_calls[{j}].id",
                    )
                seen.add(call.id)
        if turn.content is None and not turn.tool_calls:
            raise InvalidInput("content is required", field=f"turns[{i}].content")
    return sorted({call_id for _, call_id in _unanswered_results(request.turns, {})})
