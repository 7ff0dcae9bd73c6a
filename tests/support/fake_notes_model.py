"""A deterministic stand-in for an OpenAI-compatible chat model that writes notes.

Served by `tests.support.loopback.loopback_server`, it reads the request the LLM notes generator
sends (`app.notes.llm.build_messages`: the previous notes as JSON, then one `[seq N | role]` line
per new turn) and answers with the complete updated notes as JSON, computed by the rules
generator. Evaluating the `llm` generator against it measures the generator's own path — the
prompt, JSON validation, provenance enforcement, the cap — not a model's judgement.
"""

import json
import re
from datetime import UTC, datetime
from typing import Any

from app.domain.records import TurnRecord
from app.domain.tokens import message_tokens
from app.notes.policy import merge
from app.notes.rules import extract
from app.notes.schemas import Notes

_TURN_RE = re.compile(r"^\[seq (\d+) \| ([^\]]+)\] ", re.MULTILINE)
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def parse_request(user_content: str) -> tuple[Notes, list[TurnRecord]]:
    """The previous notes and the new turns of one notes request."""
    previous_json, rest = user_content.removeprefix("Previous notes:\n").split("\n\nNew turns:\n")
    body = rest.rsplit("\n\nReply with", 1)[0]
    marks = list(_TURN_RE.finditer(body))
    turns = []
    for n, mark in enumerate(marks):
        end = marks[n + 1].start() - 1 if n + 1 < len(marks) else len(body)
        role = "tool" if mark.group(2).startswith("tool") else mark.group(2)
        content = body[mark.end() : end]
        turns.append(
            TurnRecord(int(mark.group(1)), role, content, message_tokens(role, content), T0)
        )
    return Notes.model_validate_json(previous_json), turns


def reply(method: str, path: str, body: Any) -> tuple[int, Any]:
    """The loopback handler: a chat completion whose content is the updated notes."""
    previous, turns = parse_request(body["messages"][-1]["content"])
    notes = merge(previous, extract(turns, previous))
    content = json.dumps(notes.model_dump(mode="json"), ensure_ascii=False)
    return 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
