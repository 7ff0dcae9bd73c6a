"""Listing a tenant's sessions (`GET /v1/sessions`) and deleting a user's (`DELETE
/v1/users/{user_id}`), in batches, against the real API (no worker: the erase jobs only queue)."""

import uuid

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import new_key
from tests.support.server import RunningServer


async def listed(client: httpx.AsyncClient, **params: str | int) -> list[str]:
    """Every session id of the list, page after page."""
    ids: list[str] = []
    cursor: str | None = None
    while True:
        page = {**params, **({"cursor": cursor} if cursor else {})}
        resp = await client.get("/v1/sessions", params=page)
        assert resp.status_code == 200, resp.text
        ids.extend(s["session_id"] for s in resp.json()["sessions"])
        cursor = resp.json()["next_cursor"]
        if cursor is None:
            return ids


async def test_sessions_are_listed_newest_first_page_by_page_and_by_user(
    client: httpx.AsyncClient, server: RunningServer, engine: AsyncEngine
) -> None:
    created = [f"trip-{i}" for i in range(7)]
    for i, sid in enumerate(created):
        body = {"user_id": "ana" if i % 2 == 0 else "bo", "metadata": {"n": i}}
        assert (await client.put(f"/v1/sessions/{sid}", json=body)).status_code == 200
    first = (await client.get("/v1/sessions", params={"limit": 3})).json()
    assert [s["session_id"] for s in first["sessions"]] == ["trip-6", "trip-5", "trip-4"]
    newest = first["sessions"][0]
    assert newest["user_id"] == "ana" and newest["metadata"] == {"n": 6}
    assert newest["turns"] == 0 and newest["watermark"]["level"] == "normal"

    # A session changed between two pages keeps its place: none is seen twice or missed.
    appended = {"turns": [{"role": "user", "content": "Book the 9:40 train to Lyon."}]}
    assert (await client.post("/v1/sessions/trip-0/turns", json=appended)).status_code == 201
    rest = await listed(client, limit=3, cursor=first["next_cursor"])
    assert [s["session_id"] for s in first["sessions"]] + rest == created[::-1]
    assert await listed(client, user_id="ana", limit=2) == ["trip-6", "trip-4", "trip-2", "trip-0"]
    assert await listed(client, user_id="nobody") == []

    # Another tenant sees none of them; a deleted session is not listed.
    other = await new_key(engine, f"other-{uuid.uuid4().hex[:8]}", ["sessions:read"])
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {other}"}, timeout=30
    ) as outsider:
        assert not set(await listed(outsider)) & set(created)
    assert (await client.delete("/v1/sessions/trip-5")).status_code == 202
    assert await listed(client, user_id="bo") == ["trip-3", "trip-1"]


async def test_bad_list_parameters_get_a_422_naming_the_field(client: httpx.AsyncClient) -> None:
    for params, field in (
        ({"cursor": "abc"}, "cursor"),
        ({"cursor": "1.2.3"}, "cursor"),
        ({"cursor": "1." + "9" * 39}, "cursor"),  # beyond a UUID
        ({"cursor": "9" * 18 + ".1"}, "cursor"),  # beyond a datetime
        ({"limit": 0}, "limit"),
        ({"user_id": ""}, "user_id"),
        ({"user_id": "u" * 129}, "user_id"),
    ):
        resp = await client.get("/v1/sessions", params=params)
        assert resp.status_code == 422, (params, resp.text)
        assert resp.json()["error"]["field"] == field, params


async def test_a_users_sessions_are_deleted_a_hundred_per_call(
    client: httpx.AsyncClient,
) -> None:
    sessions = [f"chat-{i:03d}" for i in range(101)]
    for sid in [*sessions, "someone-elses"]:
        user = "someone" if sid == "someone-elses" else "cleo"
        assert (await client.put(f"/v1/sessions/{sid}", json={"user_id": user})).is_success

    first = await client.delete("/v1/users/cleo")
    assert first.status_code == 202, first.text
    body = first.json()
    assert len(body["sessions"]) == 100 and body["remaining_sessions"] == 1
    assert body["user_id"] == "cleo"
    # Erased in the request for its first seconds, the rest by their jobs: the answer says which.
    statuses = {s["status"] for s in body["sessions"]}
    assert body["sessions"][0]["status"] == "completed"
    assert body["status"] == ("pending" if "pending" in statuses else "completed")
    assert len({s["erase_receipt_id"] for s in body["sessions"]}) == 100
    gone = body["sessions"][0]["session_id"]
    assert (await client.get(f"/v1/sessions/{gone}")).status_code == 404
    receipt = await client.get(f"/v1/erase-receipts/{body['sessions'][0]['erase_receipt_id']}")
    # The first sessions are erased inline, in the request (`app.erasure.service.INLINE_SECONDS`).
    assert receipt.json()["session_id"] == gone and receipt.json()["status"] == "completed"
    assert await listed(client, user_id="cleo") == ["chat-000"]  # the oldest is left

    second = (await client.delete("/v1/users/cleo")).json()
    assert [s["session_id"] for s in second["sessions"]] == ["chat-000"]
    assert second["remaining_sessions"] == 0
    again = await client.delete("/v1/users/cleo")
    assert again.status_code == 404 and again.json()["error"]["field"] == "user_id"
    assert await listed(client) == ["someone-elses"]
