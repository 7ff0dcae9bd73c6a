"""Fault suite, scaled down for CI: a worker SIGKILLed during a notes refresh and during an erase,
an LLM notes endpoint answering garbage, and N clients x M turns on their own sessions and one
hot session with inline offloads and a worker (every acknowledged turn stored exactly once,
counters equal to a recount, no 5xx, every session under its trigger once the queue drains).

PostgreSQL restarted mid-appends: tests/runtime/test_worker.py; Valkey killed and restarted:
tests/sessions/test_cache_outage.py; a worker SIGKILLed mid-offload: tests/offload/test_worker.py;
an embedder hanging, dripping or answering garbage: tests/prompt/test_build_faults.py."""

import asyncio
import json
import os
import signal
import subprocess
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from tests.notes.test_notes_service import chat_reply
from tests.offload.test_sweep_counters import stored_and_counted, turn
from tests.offload.test_worker import worker_env
from tests.support.factories import session_of_key
from tests.support.faults import faulty_server
from tests.support.loopback import loopback_server
from tests.support.server import RunningServer, run_server
from tests.support.waiting import wait_for
from tests.support.workers import worker_process

OWN_DATABASE = True  # it runs workers: see tests/conftest.py

SMALL = {"context_limit": 2000, "reserve_tokens": 200, "min_recent_turns": 2}
SECRET = "the door code is 4417-KESTREL"
NOTES = {"goal": [{"text": "offsite in Lisbon", "seq": 1, "subject": None, "source": "user"}]}


def good_llm(method: str, path: str, body: Any) -> tuple[int, Any]:
    return 200, chat_reply(json.dumps(NOTES))


def llm_worker(settings: Settings, llm_url: str) -> dict[str, str]:
    """The environment of a `contextd worker` writing notes with the LLM at `llm_url`."""
    return worker_env(settings) | {
        "CONTEXTD_NOTES__GENERATOR": "llm",
        "CONTEXTD_NOTES__LLM_BASE_URL": llm_url,
        "CONTEXTD_NOTES__LLM_TIMEOUT_SECONDS": "120",
    }


def sigkill(process: subprocess.Popen[bytes]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def client(server: RunningServer, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


def lisbon_turns() -> list[dict[str, str]]:
    lines = [
        "I want to plan a two-day offsite in Lisbon for the platform team.",
        "Sure. I will look at venues and travel options.",
        f"For the venue: {SECRET}.",
        "Noted. I found three venues in Alfama and Belem.",
    ] + [f"Filler {i}: compare trains, hotels and flights for the trip." * 3 for i in range(30)]
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(lines)
    ]


async def scratchpad(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    pad: dict[str, Any] = (await http.get(f"/v1/sessions/{sid}/scratchpad")).json()
    return pad


async def receipt(http: httpx.AsyncClient, receipt_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await http.get(f"/v1/erase-receipts/{receipt_id}")).json()
    return found


async def test_a_worker_killed_during_notes_refresh_and_erase_loses_neither(
    settings: Settings, engine: AsyncEngine, admin_key: str
) -> None:
    with run_server(settings) as server, loopback_server(good_llm) as llm:
        async with client(server, admin_key) as http:
            assert (await http.put("/v1/sessions/k", json=SMALL)).status_code == 200
            assert (
                await http.post("/v1/sessions/k/turns", json={"turns": lisbon_turns()})
            ).is_success
            moved = await http.post("/v1/sessions/k/memory", json={"type": "offload"})
            assert moved.status_code == 200, moved.text  # chunks written, notes refresh queued

            # Notes refresh: the worker dies while the LLM is generating.
            with (
                faulty_server("hang") as hanging,
                worker_process(llm_worker(settings, hanging.url)) as doomed,
            ):
                assert await asyncio.to_thread(hanging.arrived.wait, 120)
                sigkill(doomed)
            assert (await scratchpad(http, "k"))["version"] == 0
            with worker_process(llm_worker(settings, llm.url)):
                pad = await wait_for(
                    lambda: scratchpad(http, "k"),
                    lambda p: p["version"] >= 1 and not p["stale"],
                    timeout=120,
                    what="the killed notes refresh to be retried",
                )
            assert pad["version"] == 1  # written once
            assert [g["text"] for g in pad["notes"]["goal"]] == ["offsite in Lisbon"]

            # Erase: the worker dies while the erase job rebuilds the notes.
            forgot = await http.post(
                "/v1/sessions/k/memory", json={"type": "forget", "turn_range": [3, 3]}
            )
            assert forgot.status_code == 200, forgot.text
            receipt_id = forgot.json()["data"]["erase_receipt_id"]
            with (
                faulty_server("hang") as hanging,
                worker_process(llm_worker(settings, hanging.url)) as doomed,
            ):
                assert await asyncio.to_thread(hanging.arrived.wait, 120)
                sigkill(doomed)
            assert (await receipt(http, receipt_id))["status"] == "pending"
            requests_before = len(llm.requests)
            with worker_process(llm_worker(settings, llm.url)):
                done = await wait_for(
                    lambda: receipt(http, receipt_id),
                    lambda r: r["status"] != "pending",
                    timeout=120,
                    what="the killed erase to be retried",
                )
    assert done["status"] == "completed", done
    assert len(llm.requests) > requests_before  # the retried erase rebuilt the notes
    pk = await session_of_key(engine, admin_key, "k")
    async with engine.connect() as conn:
        traces = await conn.scalar(
            text(
                "SELECT (SELECT count(*) FROM turns WHERE session_id = :s AND content LIKE :x)"
                " + (SELECT count(*) FROM chunks WHERE session_id = :s AND raw_text LIKE :x)"
                " + (SELECT count(*) FROM scratchpads WHERE session_id = :s"
                "    AND notes::text LIKE :x)"
            ),
            {"s": pk, "x": "%KESTREL%"},
        )
    assert traces == 0


async def test_garbage_from_the_notes_llm_keeps_builds_answering(
    settings: Settings, admin_key: str
) -> None:
    with run_server(settings) as server, faulty_server("garbage") as llm:
        async with client(server, admin_key) as http:
            assert (await http.put("/v1/sessions/g", json=SMALL)).status_code == 200
            assert (
                await http.post("/v1/sessions/g/turns", json={"turns": lisbon_turns()})
            ).is_success
            assert (await http.post("/v1/sessions/g/memory", json={"type": "offload"})).is_success
            with worker_process(llm_worker(settings, llm.url)) as running:
                assert await asyncio.to_thread(llm.arrived.wait, 120)
                built = await http.post(
                    "/v1/sessions/g/build-prompt",
                    json={"system": "You plan offsites.", "query": "Where is the offsite?"},
                )
                ready = (await http.get("/readyz")).json()
                alive = running.poll() is None
            pad = await scratchpad(http, "g")
    assert built.status_code == 200, built.text
    assert "notes_stale" in built.json()["fallbacks"]
    assert pad["version"] == 0  # nothing of the garbage was stored
    assert alive and ready["worker"]["live_workers"] >= 1


async def test_n_clients_m_turns_with_a_hot_session_and_a_worker(
    settings: Settings, engine: AsyncEngine, api_key: str
) -> None:
    clients, turns_each, builds_each = 4, 15, 5
    statuses: list[int] = []
    acknowledged: dict[str, list[tuple[int, str]]] = {}
    sids = [f"own-{c}" for c in range(clients)] + ["hot"]
    with run_server(settings, with_worker=True) as server:
        async with client(server, api_key) as http:
            for sid in sids:
                assert (await http.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
                acknowledged[sid] = []

            async def append(sid: str, body: dict[str, str]) -> None:
                resp = await http.post(f"/v1/sessions/{sid}/turns", json={"turns": [body]})
                statuses.append(resp.status_code)
                if resp.status_code == 201:
                    acknowledged[sid].append((resp.json()["turns"][0]["seq"], body["content"]))

            async def one_client(c: int) -> None:
                for i in range(turns_each):
                    await append(f"own-{c}", turn(c, i))
                    await append("hot", turn(100 + c, i))
                    if i % (turns_each // builds_each) == 0:
                        # A system prompt this long (1,681 tokens of the 1,800) puts the hot
                        # session in the emergency band with any turn in its window, however far
                        # the worker has offloaded: each of these builds that finds more than the
                        # recent turns the window keeps offloads inline.
                        resp = await http.post(
                            "/v1/sessions/hot/build-prompt",
                            json={
                                "system": "You are a travel agent. " * 280,
                                "query": f"Which order ships to Lyon? {c}.{i}",
                            },
                        )
                        statuses.append(resp.status_code)

            await asyncio.gather(*(one_client(c) for c in range(clients)))
            # The agent's last build has a short system prompt again: the window can fit.
            last = await http.post(
                "/v1/sessions/hot/build-prompt",
                json={"system": "You are a travel agent.", "query": "Which order ships?"},
            )
            statuses.append(last.status_code)
            await wait_for(
                lambda: http.get("/readyz"),
                lambda r: (
                    r.json()["worker"]["pending_jobs"] == 0
                    and r.json()["worker"]["running_jobs"] == 0
                ),
                timeout=120,
                what="the queue to drain",
            )
            views = {sid: (await http.get(f"/v1/sessions/{sid}")).json() for sid in sids}
            listed = {
                sid: (await http.get(f"/v1/sessions/{sid}/turns", params={"limit": 500})).json()[
                    "turns"
                ]
                for sid in sids
            }
    assert all(s < 500 for s in statuses), sorted(set(statuses))
    assert statuses.count(201) == clients * turns_each * 2
    for sid in sids:
        stored = [(t["seq"], t["content"]) for t in listed[sid]]
        assert sorted(acknowledged[sid]) == stored  # each acknowledged turn, exactly once
        assert views[sid]["watermark"]["ratio"] <= views[sid]["trigger_ratio"], sid
        pk = await session_of_key(engine, api_key, sid)
        counters, recount = await stored_and_counted(engine, pk)
        assert counters == recount, sid
    async with engine.connect() as conn:
        by_trigger = dict(
            (
                await conn.execute(
                    text(
                        "SELECT trigger, count(*) FROM offload_events"
                        " WHERE session_id = :s GROUP BY trigger"
                    ),
                    {"s": await session_of_key(engine, api_key, "hot")},
                )
            ).all()
        )
    # Requests on the hot session offloaded inline, beside the worker: a build in the emergency
    # band, or an append that took the window there (which leaves its build nothing to move).
    assert by_trigger.get("emergency", 0) + by_trigger.get("append", 0) > 0, by_trigger
