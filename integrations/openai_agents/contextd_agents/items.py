"""Conversions between Agents SDK input items (Responses API shapes) and contextd turns (chat
messages). A stored turn keeps its original item in `metadata.agents_item`, so the exact items
come back from the turns list."""

import json
from typing import Any

ITEM_KEY = "agents_item"
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        kind = part.get("type")
        if kind in TEXT_PARTS:
            parts.append(str(part.get("text") or part.get("refusal") or ""))
        else:
            parts.append(f"[{kind}]")
    return "\n".join(parts)


def item_to_turn(item: dict[str, Any]) -> dict[str, Any]:
    kind, role = item.get("type"), item.get("role")
    keep = {"metadata": {ITEM_KEY: item}}
    if kind in (None, "message") and role in ("user", "assistant", "system", "developer"):
        role = "system" if role == "developer" else role
        return {"role": role, "content": text_of(item.get("content")), **keep}
    if kind == "function_call":
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item.get("arguments") or ""},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call], **keep}
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else text_of(output)
        return {"role": "tool", "tool_call_id": item["call_id"], "content": text, **keep}
    # reasoning and hosted-tool items: a short assistant line for search, the item for replay
    summary = text_of(item.get("summary") or item.get("content")) or json.dumps(item)[:500]
    return {"role": "assistant", "content": f"[{kind}] {summary}", **keep}


def message_to_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One chat message (a build-prompt message or a stored turn) as input items."""
    role = message["role"]
    if role == "tool":
        call_id, output = message["tool_call_id"], message.get("content") or ""
        return [{"type": "function_call_output", "call_id": call_id, "output": output}]
    items: list[dict[str, Any]] = []
    if message.get("content"):
        items.append({"role": role, "content": message["content"]})
    for call in message.get("tool_calls") or []:
        items.append(
            {
                "type": "function_call",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"].get("arguments") or "",
            }
        )
    return items


def turn_to_item(turn: dict[str, Any]) -> dict[str, Any]:
    """A stored turn as the item it was added as (or rebuilt from its fields)."""
    original = (turn.get("metadata") or {}).get(ITEM_KEY)
    if original is not None:
        return dict(original)
    rebuilt = message_to_items(turn)
    return rebuilt[-1] if rebuilt else {"role": turn["role"], "content": ""}
