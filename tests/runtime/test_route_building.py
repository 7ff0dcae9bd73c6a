"""The routes are built when the app is created: a first request does no pydantic schema work on
the event loop (FastAPI builds an included router's routes lazily, ~0.1 s idle and several times
that under load, a stall every concurrent request saw on the first build-prompt)."""

import sys
from types import FrameType
from typing import Any

import httpx
from pydantic import TypeAdapter

from app.core.config import Settings
from app.runtime.api import create_app


async def test_a_first_request_builds_no_validators(settings: Settings) -> None:
    app = create_app(settings)
    built: list[str] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is TypeAdapter.__init__.__code__:
            built.append(frame.f_code.co_name)

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        sys.setprofile(hook)
        try:
            missing = await http.get("/v1/no/such/route")
        finally:
            sys.setprofile(None)
    assert missing.status_code == 404  # every router was tried, so every route was matched
    assert built == []
