"""A deterministic OpenAI-compatible `/v1/chat/completions` for the example agent loops.

It answers like a model would, and it refuses (HTTP 400, like the real API) a request that breaks
the chat protocol, so an agent loop or a prompt from contextd that a real API would reject fails
the test:

- a user message starting with `Recall:` (when the `memory` tool is offered) gets a tool call
  `memory {"type": "recall", "query": <the rest>}`;
- a tool result gets the answer `From memory: <the tool result on one line>`;
- anything else gets `Noted: <the message>` plus a fixed paragraph (so a conversation fills the
  window quickly).
"""

import json
from typing import Any

from tests.support.loopback import Handler

FILLER = (
    "We compare trains, hotels and flights for the trip to Lyon, weighing comfort, timing and "
    "the connections at each station, and we keep the options open until the user decides. "
    "Morning trains are quicker but fuller; the afternoon ones are calmer and often cheaper, "
    "while flights only pay off with hand luggage and an early check-in at the airport. "
    "Hotels near Part-Dieu are handy for trains, those in Vieux Lyon are quieter at night, "
    "and both usually have rooms left when we confirm a day or two ahead."
)
MODEL = "fake-chat-1"
ROLES = {"system", "user", "assistant", "tool"}


def protocol_problems(body: Any, model: str) -> list[str]:
    """What the OpenAI chat API would reject in this request body."""
    if not isinstance(body, dict):
        return ["body is not a JSON object"]
    problems = []
    if body.get("model") != model:
        problems.append(f"model is {body.get('model')!r}, expected {model!r}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*problems, "messages must be a non-empty list"]
    pending: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            problems.append(f"messages[{i}].role {role!r}")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                problems.append(f"messages[{i}] answers tool call {call_id!r} nobody made")
            pending.discard(call_id)
            continue
        if pending:
            problems.append(f"messages[{i}]: tool calls {sorted(pending)} were never answered")
            pending = set()
        if role == "assistant" and message.get("tool_calls"):
            pending = {call["id"] for call in message["tool_calls"]}
        elif not isinstance(message.get("content"), str):
            problems.append(f"messages[{i}].content is not a string")
    for tool in body.get("tools") or []:
        if tool.get("type") != "function" or not tool.get("function", {}).get("name"):
            problems.append(f"tool {tool!r} is not a function definition")
    return problems


def completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def chat_model(model: str) -> Handler:
    def handle(method: str, path: str, body: Any) -> tuple[int, Any]:
        if (method, path) != ("POST", "/v1/chat/completions"):
            return 404, {"error": {"message": f"no route {method} {path}"}}
        problems = protocol_problems(body, model)
        if problems:
            return 400, {"error": {"message": "; ".join(problems), "type": "invalid_request"}}
        # The conversation's latest message: what a step found in history may follow it as a
        # system message (contextd puts it after an agent step's transcript).
        last = next(m for m in reversed(body["messages"]) if m["role"] != "system")
        offered = {t["function"]["name"] for t in body.get("tools") or []}
        if last["role"] == "tool":
            flat = " ".join(str(last["content"]).split())  # one line, so answers are lines
            reply = {"role": "assistant", "content": f"From memory: {flat}"}
            return 200, completion(reply, "stop")
        text = last.get("content") or ""
        if text.startswith("Recall:") and "memory" in offered:
            args = {"type": "recall", "query": text.removeprefix("Recall:").strip()}
            call = {
                "id": f"call_{len(body['messages'])}",
                "type": "function",
                "function": {"name": "memory", "arguments": json.dumps(args)},
            }
            reply = {"role": "assistant", "content": None, "tool_calls": [call]}
            return 200, completion(reply, "tool_calls")
        return 200, completion({"role": "assistant", "content": f"Noted: {text} {FILLER}"}, "stop")

    return handle
