"""Logs carry no conversation text unless a debug switch says so: a build's query is logged as
its length and a short hash."""

import hashlib
import logging

import httpx
import pytest

from app.core.config import Settings
from tests.agent.test_memory_tool_api import offloaded_session
from tests.support.server import run_server

SECRET = "where did we put the blue-falcon-7731 invoice?"


def text_of(record: logging.LogRecord) -> str:
    return " ".join([record.getMessage(), *(str(v) for v in record.__dict__.values())])


@pytest.mark.parametrize("log_text", [False, True], ids=["default", "debug switch"])
async def test_build_logs_hold_lengths_and_hashes_not_the_query(
    settings: Settings, admin_key: str, caplog: pytest.LogCaptureFixture, log_text: bool
) -> None:
    caplog.set_level(logging.INFO)
    with run_server(settings.model_copy(update={"log_text": log_text})) as server:
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
        ) as admin:
            await offloaded_session(admin, "private", "The invoice number is INV-2291.")
            built = await admin.post("/v1/sessions/private/build-prompt", json={"query": SECRET})
            assert built.status_code == 200, built.text
            assert built.json()["recall"]["query_raw"] == SECRET
    [line] = [r for r in caplog.records if r.getMessage() == "build_prompt"]
    assert line.query_raw_chars == len(SECRET)  # type: ignore[attr-defined]
    assert line.query_raw_sha256 == hashlib.sha256(SECRET.encode()).hexdigest()[:16]  # type: ignore[attr-defined]
    leaked = [r.name for r in caplog.records if "blue-falcon-7731" in text_of(r)]
    assert leaked == (["contextd.prompt"] if log_text else [])
