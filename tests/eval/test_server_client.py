"""The evals' HTTP client on a real loopback server: a 429 (a key's rate limit, which a fast
eval reaches) is sent again after its Retry-After instead of ending the run."""

from typing import Any

from app.eval.driver import server_client
from tests.support.loopback import loopback_server


async def test_a_rate_limited_request_is_sent_again() -> None:
    answers = iter([(429, {"error": {"code": "rate_limited"}})] * 2 + [(201, {"ok": True})])

    def handler(method: str, path: str, body: Any) -> tuple[int, Any]:
        return next(answers)

    with loopback_server(handler) as server:
        async with server_client(server.url, None, max_wait_s=0) as http:
            resp = await http.post("/v1/sessions/s/turns", json={"turns": [{"role": "user"}]})
    assert (resp.status_code, resp.json()) == (201, {"ok": True})
    assert [r[:2] for r in server.requests] == [("POST", "/v1/sessions/s/turns")] * 3
    assert all(r[2] == {"turns": [{"role": "user"}]} for r in server.requests)


async def test_other_refusals_come_back_as_they_are() -> None:
    def handler(method: str, path: str, body: Any) -> tuple[int, Any]:
        return 422, {"error": {"field": "turns"}}

    with loopback_server(handler) as server:
        async with server_client(server.url, None, max_wait_s=0) as http:
            resp = await http.post("/v1/sessions/s/turns", json={"turns": []})
    assert resp.status_code == 422 and len(server.requests) == 1
