"""Whether a built prompt is a message list providers accept, as far as tool calls go.

OpenAI format: each `tool` message comes right after the assistant message holding its call, or
after sibling results of that message's calls; each call of an assistant message is answered
before the next message that is not a tool result; no call id twice in one message, no result
twice. Anthropic format: each `tool_use` block's result is a `tool_result` block of the very next
(user) message, and each `tool_result` answers a `tool_use` of the message right before it.
"""

from collections.abc import Mapping, Sequence
from typing import Any


def pairing_errors(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is wrong with the OpenAI-format `messages` (empty: nothing)."""
    errors: list[str] = []
    waiting: list[str] = []  # the calls of the current assistant message not yet answered
    answered: set[str] = set()
    in_run = False  # right after an assistant message with calls, or after its results
    for at, message in enumerate(messages):
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if not in_run:
                errors.append(f"message {at}: tool result {call_id!r} does not follow its call")
            elif call_id in answered:
                errors.append(f"message {at}: a second result for call {call_id!r}")
            elif call_id not in waiting:
                errors.append(f"message {at}: tool result {call_id!r} answers no call before it")
            else:
                waiting.remove(call_id)
                answered.add(call_id)
            continue
        if waiting:
            errors.append(f"message {at}: calls {waiting} have no result before it")
        ids = [str(call.get("id")) for call in message.get("tool_calls") or []]
        if len(set(ids)) < len(ids):
            errors.append(f"message {at}: a call id twice in one message: {ids}")
        in_run = message.get("role") == "assistant" and bool(ids)
        waiting, answered = (list(ids), set()) if in_run else ([], set())
    if waiting:
        errors.append(f"end: calls {waiting} have no result")
    return errors


def anthropic_pairing_errors(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is wrong with the Anthropic-format `messages` (empty: nothing)."""
    errors: list[str] = []
    waiting: set[str] = set()  # tool_use ids of the message before
    for at, message in enumerate(messages):
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        results = [str(b.get("tool_use_id")) for b in blocks if b.get("type") == "tool_result"]
        for result in results:
            if result not in waiting:
                errors.append(f"message {at}: tool_result {result!r} answers no tool_use before it")
        if len(set(results)) < len(results):
            errors.append(f"message {at}: a tool_result twice: {results}")
        if waiting - set(results):
            errors.append(f"message {at}: tool_use {sorted(waiting - set(results))} unanswered")
        uses = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
        if len(set(uses)) < len(uses):
            errors.append(f"message {at}: a tool_use id twice in one message: {uses}")
        waiting = set(uses) if message.get("role") == "assistant" else set()
    if waiting:
        errors.append(f"end: tool_use {sorted(waiting)} unanswered")
    return errors
