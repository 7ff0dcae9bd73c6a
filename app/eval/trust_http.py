"""What the scenarios of `contextd eval trust` say to a running contextd over HTTP: sessions of a
small window, appends, builds, memory tool calls and the places a value may still show."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.eval.driver import check_response
from app.eval.trust import filler
from app.notes.policy import NOTES_HEADER

# A small window with low floors, so that a final offload moves every scenario turn out of it.
WINDOW = {
    "context_limit": 2000,
    "reserve_tokens": 200,
    "min_recent_turns": 1,
    "min_recent_tokens": 50,
    "target_ratio": 0.3,
}
POLL_S = 0.25


@dataclass(frozen=True, slots=True)
class TrustConfig:
    url: str
    api_key: str | None = None
    timeout_s: float = 300.0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])


async def configure(http: Any, sid: str, user: str) -> None:
    body = {**WINDOW, "user_id": user, "metadata": {"eval": "trust"}}
    check_response(await http.put(f"/v1/sessions/{sid}", json=body), f"configure {sid}")


async def append(http: Any, sid: str, turns: Sequence[dict[str, Any]]) -> list[int]:
    out = check_response(
        await http.post(f"/v1/sessions/{sid}/turns", json={"turns": list(turns)}), f"append {sid}"
    )
    return [int(t["seq"]) for t in out["turns"]]


async def build(http: Any, sid: str, query: str, **options: Any) -> dict[str, Any]:
    return dict(
        check_response(
            await http.post(f"/v1/sessions/{sid}/build-prompt", json={"query": query, **options}),
            f"build {sid}",
        )
    )


def prompt_text(built: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in built["messages"])


def notes_block(built: dict[str, Any]) -> str:
    return "\n".join(
        str(m.get("content") or "")
        for m in built["messages"]
        if str(m.get("content") or "").startswith(NOTES_HEADER)
    )


async def memory_call(http: Any, sid: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await http.post(f"/v1/sessions/{sid}/memory", json=body)
    return dict(check_response(resp, f"memory {body['type']} {sid}"))


def tool_turns(language: str, request: str, tool: str, result: str) -> list[dict[str, Any]]:
    """A user request, the tool call, its result, the assistant's answer, then filler."""
    call = {"id": "call-1", "type": "function", "function": {"name": tool, "arguments": "{}"}}
    done = "Here is what I found." if language == "en" else "这是我查到的内容。"
    return [
        {"role": "user", "content": request},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-1", "name": tool, "content": result},
        {"role": "assistant", "content": done},
        *({"role": role, "content": text} for role, text in filler(language)),
    ]
