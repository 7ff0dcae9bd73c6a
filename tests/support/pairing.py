"""Whether a built prompt in Anthropic format is a message list the provider accepts, as far as
tool calls go: each `tool_use` block's result is a `tool_result` block of the very next (user)
message, and each `tool_result` answers a `tool_use` of the message right before it. The OpenAI
format's check is `app.eval.agent.validity_problems` (the eval scores prompts with it).
"""

from collections.abc import Mapping, Sequence
from typing import Any


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
