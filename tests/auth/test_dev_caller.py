"""Auth disabled (`contextd dev`): every request is the `default` tenant's, whatever the first
request of the process was."""

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from tests.support.server import RunningServer, run_server

OWN_DATABASE = True  # the `default` tenant must not exist before the first request


@pytest.fixture(scope="module")
def dev_server(settings: Settings) -> Iterator[RunningServer]:
    with run_server(settings.model_copy(update={"auth_disabled": True})) as running:
        yield running


async def test_a_first_request_that_rolls_back_still_stores_the_dev_tenant(
    dev_server: RunningServer, engine: AsyncEngine
) -> None:
    async with httpx.AsyncClient(base_url=dev_server.url) as http:
        missing = await http.get("/v1/sessions/never-seen")  # 404: its transaction rolls back
        appended = await http.post(
            "/v1/sessions/s1/turns", json={"turns": [{"role": "user", "content": "你好 hello"}]}
        )
        listed = await http.get("/v1/sessions/s1")
    assert missing.status_code == 404
    assert appended.status_code == 201, appended.text
    assert listed.json()["counts"]["turns"] == 1
    async with engine.connect() as conn:
        owners = await conn.scalar(
            text(
                "SELECT count(DISTINCT n.name) FROM sessions s JOIN tenants n ON n.id = s.tenant_id"
                " WHERE s.external_id = 's1' AND n.name = 'default'"
            )
        )
    assert owners == 1
