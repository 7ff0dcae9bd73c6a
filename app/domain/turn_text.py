"""How a turn reads as text: its label, its body (content, then its tool calls as JSON) and the
line a chunk's raw text holds for it. Offload writes it, recall reads tool calls back from it."""

from app.domain.records import TurnRecord
from app.domain.tokens import tool_calls_text

# The line `turn_body` ends a calling turn with: "<role> → tool_calls: <json>".
TOOL_CALLS_MARK = " → tool_calls: "


def turn_label(turn: TurnRecord) -> str:
    """`user`, `assistant (name)`, `tool[call_id]`…, on one line."""
    label = turn.role
    if turn.tool_call_id:
        label += f"[{turn.tool_call_id}]"
    if turn.name:
        label += f" ({turn.name})"
    return " ".join(label.split())


def turn_body(turn: TurnRecord) -> str:
    """The content, then a `role → tool_calls: <json>` line when the turn calls tools."""
    calls = tool_calls_text(turn.tool_calls)
    if not calls:
        return turn.content
    line = f"{turn.role}{TOOL_CALLS_MARK}{calls}"
    return f"{turn.content}\n{line}" if turn.content else line


def render_turn(turn: TurnRecord) -> str:
    """The turn as it appears in a chunk's raw_text (content verbatim after the label)."""
    if not turn.content and turn.tool_calls:
        return turn_body(turn)
    return f"{turn_label(turn)}: {turn_body(turn)}"
