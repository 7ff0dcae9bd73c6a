"""build-prompt is answered by a direct route (`app.http.direct`): a successful build writes one
log line (the build line, with the tenant), a refused one its access line; what the direct route
hands to the full stack is answered exactly as before, and its answers carry the request id."""

import logging

import httpx
import pytest

from app.core.config import Settings
from tests.support.server import RunningServer
from tests.support.waiting import wait_for

ROUTE = "/v1/sessions/{session_id}/build-prompt"


def lines_of(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger]


async def test_a_successful_build_writes_one_line_and_a_refused_one_its_access_line(
    server: RunningServer,
    client: httpx.AsyncClient,
    tenant_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    built = await client.post(
        "/v1/sessions/one-line/build-prompt",
        json={"query": "what was the order number?"},
        headers={"X-Request-ID": "one-line-build"},
    )
    assert built.status_code == 200, built.text
    assert built.headers["X-Request-ID"] == "one-line-build"
    assert built.headers["content-type"] == "application/json"
    refused = await client.post("/v1/sessions/one-line/build-prompt", json={"query": 5})
    assert refused.status_code == 422

    async def access_lines() -> list[logging.LogRecord]:
        return [r for r in lines_of(caplog, "contextd.access") if r.route == ROUTE]  # type: ignore[attr-defined]

    # The server writes a request's access line after its answer is sent: wait for the second's,
    # written after the first request's had its turn.
    [access] = await wait_for(access_lines, bool, what="the refused build's access line")
    assert (access.status, access.tenant) == (422, tenant_name)  # type: ignore[attr-defined]
    [build_line] = [
        r for r in lines_of(caplog, "contextd.prompt") if r.getMessage() == "build_prompt"
    ]
    assert build_line.tenant == tenant_name  # type: ignore[attr-defined]
    assert build_line.session == "one-line"  # type: ignore[attr-defined]
    assert build_line.build_id == built.json()["build_id"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("content", "headers", "status", "code", "field"),
    [
        ('{"query": "x",}', {"content-type": "application/json"}, 422, "malformed_json", "body"),
        (
            '{"query": "x"}',
            {"content-type": "text/plain"},
            415,
            "unsupported_media_type",
            "Content-Type",
        ),
        ('{"quary": "x"}', {"content-type": "application/json"}, 422, "invalid_input", "quary"),
        (
            '{"query": "a\\u0000b"}',
            {"content-type": "application/json"},
            422,
            "invalid_text",
            "query",
        ),
    ],
    ids=["malformed", "not json", "unknown field", "nul"],
)
async def test_what_the_direct_route_hands_on_is_answered_by_the_full_stack(
    client: httpx.AsyncClient,
    content: str,
    headers: dict[str, str],
    status: int,
    code: str,
    field: str,
) -> None:
    resp = await client.post(
        "/v1/sessions/handed-on/build-prompt", content=content, headers=headers
    )
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert (error["code"], error.get("field")) == (code, field)


async def test_an_invalid_session_id_and_a_missing_key_are_refused_as_before(
    server: RunningServer, client: httpx.AsyncClient, settings: Settings
) -> None:
    bad = await client.post("/v1/sessions/has%20space/build-prompt", json={"query": "x"})
    assert bad.status_code == 422
    assert (bad.json()["error"]["code"], bad.json()["error"]["field"]) == (
        "invalid_session_id",
        "session_id",
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as anonymous:
        missing = await anonymous.post("/v1/sessions/s/build-prompt", json={"query": "x"})
    assert missing.status_code == 401
    assert missing.json()["error"]["field"] == "Authorization"
    assert settings.auth_disabled is False
