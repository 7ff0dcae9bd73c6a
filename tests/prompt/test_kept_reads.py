"""What build-prompt read of a session is kept per process by version: the window by the
session row's version (`app.prompt.snapshot`; its turns are not read again while the row and its
version are the same), the notes by the notes version (`app.prompt.gather`). Every build after
an append or a forget shows the window and the notes as they are then, in English and Chinese."""

import dataclasses
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import create_reader_pool, read_once
from app.domain.records import TurnRecord
from app.store.models import Session
from app.store.turns import SessionWindow, offloaded_tail, session_with_window
from tests.notes.test_notes_service import CHINESE, ENGLISH, as_turns, offloaded_session, refresh
from tests.support.factories import new_caller

TURNS = {
    "en": ["The invoice number is QX-4471.", "Noted: QX-4471, due Friday.", "Ship it to Oslo."],
    "zh": ["发票号码是QX-4471。", "记下了：QX-4471，周五到期。", "寄到奥斯陆。"],
}


async def append(admin: httpx.AsyncClient, sid: str, contents: list[str]) -> None:
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": c}
        for i, c in enumerate(contents)
    ]
    resp = await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})
    assert resp.status_code == 201, resp.text


async def window_of(admin: httpx.AsyncClient, sid: str) -> list[str]:
    resp = await admin.post(f"/v1/sessions/{sid}/build-prompt", json={"query": "where to?"})
    assert resp.status_code == 200, resp.text
    return [str(m["content"]) for m in resp.json()["messages"][:-1]]


def detached(session: Session, **changes: Any) -> Session:
    """A copy of a detached session row with some attributes changed."""
    copy = Session.__mapper__.class_manager.new_instance()
    copy.__dict__.update(
        {k: v for k, v in session.__dict__.items() if not k.startswith("_sa_")} | changes
    )
    return copy


@pytest.mark.parametrize("lang", ["en", "zh"])
async def test_the_window_is_read_again_only_when_the_row_or_its_version_changed(
    admin: httpx.AsyncClient,
    engine: AsyncEngine,
    settings: Settings,
    tenant_name: str,
    lang: str,
) -> None:
    sid = f"kept-window-{lang}"
    await append(admin, sid, TURNS[lang])
    async with engine.connect() as conn:
        tenant_id = (
            await conn.execute(text("SELECT id FROM tenants WHERE name = :n"), {"n": tenant_name})
        ).scalar_one()
    reader = create_reader_pool(settings)
    try:

        async def read(kept: SessionWindow | None) -> SessionWindow:
            found = await read_once(
                reader, lambda conn: session_with_window(conn, tenant_id, sid, kept)
            )
            assert found is not None
            return found

        first = await read(None)
        assert [t.content for t in first.window] == TURNS[lang]
        # A kept window stands for the same row at the same version: marked turns show that it
        # was not read again.
        marker = dataclasses.replace(first.window[0], content="kept, not read")
        kept = SessionWindow(first.session, [marker])
        assert [t.content for t in (await read(kept)).window] == ["kept, not read"]
        older = SessionWindow(detached(first.session, version=first.session.version - 1), [marker])
        assert [t.content for t in (await read(older)).window] == TURNS[lang]
        other = SessionWindow(detached(first.session, id=first.session.tenant_id), [marker])
        assert [t.content for t in (await read(other)).window] == TURNS[lang]
        await append(admin, sid, ["And to Bergen."])
        after = await read(kept)
        assert after.session.version > first.session.version
        assert [t.content for t in after.window] == [*TURNS[lang], "And to Bergen."]
        assert all(isinstance(t, TurnRecord) for t in after.window)
    finally:
        await reader.dispose()


@pytest.mark.parametrize("lang", ["en", "zh"])
async def test_builds_show_the_window_after_an_append_and_a_forget(
    admin: httpx.AsyncClient, lang: str
) -> None:
    sid = f"kept-window-builds-{lang}"
    await append(admin, sid, TURNS[lang])
    assert await window_of(admin, sid) == TURNS[lang]
    assert await window_of(admin, sid) == TURNS[lang]  # from the kept window
    await append(admin, sid, TURNS[lang][:1])
    assert await window_of(admin, sid) == [*TURNS[lang], TURNS[lang][0]]
    forgot = await admin.post(
        f"/v1/sessions/{sid}/memory", json={"type": "forget", "turn_range": [2, 2]}
    )
    assert forgot.status_code == 200, forgot.text
    shown = await window_of(admin, sid)
    assert shown == [TURNS[lang][0], TURNS[lang][2], TURNS[lang][0]]
    assert TURNS[lang][1] not in shown


@pytest.mark.parametrize(
    ("script", "constraint"),
    [(ENGLISH, "8000 EUR"), (CHINESE, "5万元")],
    ids=["en", "zh"],
)
async def test_builds_show_the_notes_version_the_session_names(
    admin: httpx.AsyncClient,
    engine: AsyncEngine,
    settings: Settings,
    cache: Cache,
    tenant_name: str,
    script: list[tuple[str, str]],
    constraint: str,
) -> None:
    caller = await new_caller(engine, tenant_name)
    sid = f"kept-notes-{len(constraint)}"
    _, pk = await offloaded_session(engine, settings, cache, as_turns(script[:6]), caller, sid)
    assert await refresh(engine, settings, cache, pk) == "written"
    first = await window_of(admin, sid)
    assert any(constraint in m for m in first), first
    assert await window_of(admin, sid) == first  # the notes kept at their version
    forgot = await admin.post(
        f"/v1/sessions/{sid}/memory", json={"type": "forget", "turn_range": [3, 3]}
    )
    assert forgot.status_code == 200, forgot.text
    after = await window_of(admin, sid)
    assert not any(constraint in m for m in after), after


async def build(admin: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    resp = await admin.post(f"/v1/sessions/{sid}/build-prompt", json={"query": "where?", **body})
    assert resp.status_code == 200, resp.text
    return {k: v for k, v in resp.json().items() if k not in ("build_id", "timings_ms")}


@pytest.mark.parametrize("lang", ["en", "zh"])
async def test_a_kept_windows_turn_items_serve_only_builds_that_include_every_turn(
    admin: httpx.AsyncClient, lang: str
) -> None:
    sid = f"kept-window-items-{lang}"
    await append(admin, sid, TURNS[lang] * 4)
    first = await build(admin, sid)
    turns = [m for m in first["manifest"] if m["layer"] == "c1"]
    assert [(m["id"], m["included"], m["reason"]) for m in turns] == [
        (f"turn:{seq}", True, None) for seq in range(1, 13)
    ]
    assert await build(admin, sid) == first  # the kept window's turn items
    # A budget that leaves the oldest turns out: their items say so.
    short = await build(admin, sid, context_limit=first["usage"]["total"] - 20, reserve_tokens=0)
    reasons = [m["reason"] for m in short["manifest"] if m["layer"] == "c1"]
    assert reasons[0] == "window_truncated" and reasons[-1] is None
    assert await build(admin, sid) == first


@pytest.mark.parametrize(("script", "lang"), [(ENGLISH, "en"), (CHINESE, "zh")], ids=["en", "zh"])
async def test_the_offloaded_tail_stops_before_the_window_a_build_read(
    engine: AsyncEngine,
    settings: Settings,
    cache: Cache,
    script: list[tuple[str, str]],
    lang: str,
) -> None:
    """A build reads its window, then the offloaded turns before it: an offload that commits in
    between has moved the window's oldest turns into chunks, and the tail must not hold them a
    second time (the prompt would show them twice)."""
    caller, pk = await offloaded_session(
        engine, settings, cache, as_turns(script[:6]), sid=f"tail-before-{lang}"
    )
    tenant = caller.tenant_id
    reader = create_reader_pool(settings)
    try:

        async def tail(before: int) -> list[int]:
            found = await read_once(
                reader,
                lambda conn: offloaded_tail(
                    conn, tenant, pk, before=before, tokens=10**6, turns=200
                ),
            )
            assert all(chunk for _, chunk in found)
            return [turn.seq for turn, _ in found]

        # Turns 1-6 are offloaded; a window read before the offload started at turn 4.
        assert await tail(7) == [1, 2, 3, 4, 5, 6]
        assert await tail(4) == [1, 2, 3]
        assert await tail(1) == []
    finally:
        await reader.dispose()
