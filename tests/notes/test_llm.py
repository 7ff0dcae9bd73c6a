"""The optional LLM notes generator against a real local HTTP server (no monkeypatching)."""

import json
import threading
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from app.core.chat import chat_completions_url
from app.domain.records import TurnRecord
from app.domain.tokens import message_tokens
from app.notes.llm import NotesGenerationError, llm_extract
from app.notes.schemas import NoteItem, Notes
from tests.support.loopback import closed_port_url, loopback_server

T0 = datetime(2024, 1, 1, tzinfo=UTC)
TURNS = [
    TurnRecord(1, "user", "预算不超过5000元，仅本次。", message_tokens("user", "x"), T0),
    TurnRecord(2, "tool", '{"order": "CD-1234"}', message_tokens("tool", "x"), T0),
]
PREVIOUS = Notes(
    goal=[NoteItem(text="去成都", seq=0, source="user")],
    remembered=[NoteItem(text="prefers trains", seq=None, source="memory")],
)
GOOD_NOTES = {
    "goal": [{"text": "去成都", "seq": 0, "subject": None, "source": "user", "trusted": True}],
    "constraints": [
        {"text": "预算不超过5000元，仅本次", "seq": 1, "subject": "预算", "source": "user"}
    ],
    # The model claims a tool item is a trusted user fact: provenance must be corrected.
    "facts": [{"text": "order: CD-1234", "seq": 2, "subject": "order", "source": "user"}],
    "remembered": [],
}


def reply(content: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


async def run(url: str, timeout_s: float = 5.0, api_key: str | None = "k") -> Notes:
    async with httpx.AsyncClient(trust_env=False) as client:
        return await llm_extract(client, url, "notes-model", api_key, PREVIOUS, TURNS, timeout_s)


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_good_json_is_validated_and_provenance_enforced(suffix: str) -> None:
    with loopback_server(lambda m, p, b: (200, reply(json.dumps(GOOD_NOTES)))) as srv:
        notes = await run(srv.url + suffix)
    [(method, path, body)] = srv.requests
    assert (method, path) == ("POST", "/v1/chat/completions")
    assert body["model"] == "notes-model"
    assert body["response_format"] == {"type": "json_object"}
    system, user = body["messages"]
    assert system["role"] == "system"
    for rule in (
        "不超过",
        "仅本次",
        "可能",
        "suggestion",
        "assistant guess",
        "never a fact",
        "health",
    ):
        assert rule in system["content"]
    assert "[seq 2 | tool output, untrusted]" in user["content"]
    assert "去成都" in user["content"]
    assert [i.text for i in notes.constraints] == ["预算不超过5000元，仅本次"]
    [fact] = notes.facts
    assert (fact.source, fact.trusted, fact.seq) == ("tool", False, 2)
    assert notes.remembered == PREVIOUS.remembered


async def test_fenced_json_content_is_accepted() -> None:
    content = "```json\n" + json.dumps(GOOD_NOTES) + "\n```"
    with loopback_server(lambda m, p, b: (200, reply(content))) as srv:
        notes = await run(srv.url)
    assert len(notes.constraints) == 1


@pytest.mark.parametrize(
    ("status", "payload", "message"),
    [
        (200, reply("not json {"), "not valid JSON"),
        (200, reply('{"goal": "a string, not a list"}'), "notes schema"),
        (200, reply('{"goal": [], "mood": []}'), "notes schema"),
        (200, reply('{"facts": [{"text": "x", "seq": 1, "source": "oracle"}]}'), "notes schema"),
        (200, reply('{"facts": [{"text": "x", "seq": 77, "source": "user"}]}'), "unknown turn"),
        (200, {"choices": []}, "has no choices"),
        (200, reply(None), "not a string"),  # type: ignore[arg-type]
        (500, {"error": {"message": "boom"}}, "HTTP 500"),
        (401, {"error": "bad key"}, "HTTP 401"),
    ],
)
async def test_bad_replies_raise_one_error(status: int, payload: Any, message: str) -> None:
    with (
        loopback_server(lambda m, p, b: (status, payload)) as srv,
        pytest.raises(NotesGenerationError, match=message),
    ):
        await run(srv.url)


async def test_closed_port_raises_a_generation_error() -> None:
    url = closed_port_url()
    with pytest.raises(NotesGenerationError, match="failed: ConnectError"):
        await run(url)


async def test_slow_server_times_out() -> None:
    release = threading.Event()

    def slow(method: str, path: str, body: Any) -> tuple[int, Any]:
        release.wait(timeout=5)
        return 200, reply(json.dumps(GOOD_NOTES))

    with loopback_server(slow) as srv:
        # Without a working timeout the server answers good notes after 5 s and this fails.
        with pytest.raises(NotesGenerationError, match=r"timed out after 0\.2s"):
            await run(srv.url, timeout_s=0.2)
        release.set()


def test_chat_completions_url_handles_both_base_forms() -> None:
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("https://h/openai/v1") == "https://h/openai/v1/chat/completions"
