"""The prompts other context strategies would send at a step of a trajectory (`contextd eval
agent`), computed locally with the server's own token counter and call/result grouping.

- **full history**: the system prompt and every message so far.
- **truncation**: the system prompt and the newest messages that fit `C - r`, cut only between
  groups that keep every call with its results (`app.domain.tool_groups.tool_groups`).
- **tool-result clearing, keep N**: every tool result but the N newest replaced by
  `CLEARED_PLACEHOLDER` (its call id and name kept), then truncation — as Anthropic's
  `clear_tool_uses` and LangChain's `ClearToolUsesEdit` do.
"""

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from app.domain.budget import REPLY_PRIMING_TOKENS
from app.domain.records import TurnRecord
from app.domain.tokens import message_tokens
from app.domain.tool_groups import tool_groups
from app.prompt.blocks import turn_message

CLEARED_PLACEHOLDER = "[tool result cleared]"
_TS = datetime(2024, 5, 15, tzinfo=UTC)  # turns need a time; no baseline reads it


def turn_record(seq: int, message: Mapping[str, Any]) -> TurnRecord:
    """A trajectory message as contextd stores it (null content as ""), costed like the server."""
    content = str(message.get("content") or "")
    role = str(message["role"])
    name, calls, call_id = (
        message.get("name"),
        message.get("tool_calls"),
        message.get("tool_call_id"),
    )
    return TurnRecord(
        seq=seq,
        role=role,
        content=content,
        token_count=message_tokens(role, content, name, calls, call_id),
        created_at=_TS,
        name=name,
        tool_calls=calls,
        tool_call_id=call_id,
    )


def turn_records(messages: Sequence[Mapping[str, Any]]) -> list[TurnRecord]:
    return [turn_record(seq, m) for seq, m in enumerate(messages, start=1)]


def system_message(system: str) -> dict[str, Any]:
    return {"role": "system", "content": system}


def prompt_tokens(system: str, turns: Sequence[TurnRecord]) -> int:
    """`app.domain.tokens.messages_tokens` of the system message and `turns`, from the turns'
    stored counts."""
    return (
        REPLY_PRIMING_TOKENS + message_tokens("system", system) + sum(t.token_count for t in turns)
    )


def full_history(system: str, turns: Sequence[TurnRecord]) -> list[dict[str, Any]]:
    return [system_message(system), *(turn_message(t) for t in turns)]


def truncated_turns(system: str, turns: Sequence[TurnRecord], available: int) -> list[TurnRecord]:
    """The newest call/result groups of `turns` that fit in `available` tokens with the system
    prompt (none when the newest group alone does not)."""
    used = prompt_tokens(system, [])
    kept: list[list[TurnRecord]] = []
    for group in reversed(tool_groups(turns)):
        cost = sum(t.token_count for t in group)
        if used + cost > available:
            break
        kept.append(group)
        used += cost
    return [t for group in reversed(kept) for t in group]


def truncation(system: str, turns: Sequence[TurnRecord], available: int) -> list[dict[str, Any]]:
    return full_history(system, truncated_turns(system, turns, available))


def cleared_turns(turns: Sequence[TurnRecord], keep: int) -> list[TurnRecord]:
    """`turns` with every tool result but the `keep` newest replaced by the placeholder."""
    results = [i for i, t in enumerate(turns) if t.role == "tool"]
    cleared = set(results[: max(len(results) - keep, 0)])
    return [
        turn_record(
            t.seq,
            {
                "role": t.role,
                "content": CLEARED_PLACEHOLDER,
                "name": t.name,
                "tool_call_id": t.tool_call_id,
            },
        )
        if i in cleared
        else t
        for i, t in enumerate(turns)
    ]


def clearing(
    system: str, turns: Sequence[TurnRecord], available: int, keep: int = 3
) -> list[dict[str, Any]]:
    return truncation(system, cleared_turns(turns, keep), available)
