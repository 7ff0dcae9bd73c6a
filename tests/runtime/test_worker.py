"""The worker outlives PostgreSQL: a restart mid-appends (the server really restarted, in
`immediate` mode) loses no acknowledged turn, answers 503 rather than 500 while down, and
offloads resume without restarting contextd; `/readyz` tells a dead worker and stuck jobs."""

import asyncio
import signal
import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from app.core.config import Settings
from app.jobs.queue import TaskName, enqueue, enqueue_offload
from app.runtime.embedded import EmbeddedStack
from app.runtime.worker import create_job_app, retry_stalled_jobs
from app.store.models import SessionKey
from tests.offload.test_sweep_counters import turn
from tests.offload.test_worker import worker_env
from tests.support.factories import session_of_key, tenant_of, transaction
from tests.support.server import run_server
from tests.support.waiting import wait_for
from tests.system.deployment import job_worker_ids

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py

SMALL = {"context_limit": 3000, "reserve_tokens": 200, "min_recent_turns": 2}


async def readiness(http: httpx.AsyncClient) -> dict[str, Any]:
    resp = await http.get("/readyz")
    body: dict[str, Any] = resp.json()
    return body


async def test_readyz_reports_no_live_worker_and_stuck_jobs(
    settings: Settings, engine: Any, api_key: str
) -> None:
    with run_server(settings) as api:  # the API alone: no worker anywhere
        async with httpx.AsyncClient(
            base_url=api.url, headers={"Authorization": f"Bearer {api_key}"}
        ) as http:
            assert (
                await http.post(
                    "/v1/sessions/r/turns", json={"turns": [{"role": "user", "content": "hi"}]}
                )
            ).status_code == 201
            pk = await session_of_key(engine, api_key, "r")
            async with transaction(engine) as db:
                assert await enqueue_offload(
                    db, SessionKey(await tenant_of(db, pk), pk), trigger="test"
                )
                # A job left running by a worker that died (no worker holds it).
                await db.execute(
                    text("UPDATE procrastinate_jobs SET status = 'doing' WHERE lock = :lock"),
                    {"lock": f"session:{pk}"},
                )
            ready = await readiness(http)
            assert ready["status"] == "degraded"
            assert ready["worker"]["ok"] is False
            assert ready["worker"]["live_workers"] == 0
            assert ready["worker"]["stuck_jobs"] == 1
            assert ready["worker"]["running_jobs"] == 1

            with run_server(settings, with_worker=True):  # a worker comes up and retries it
                ready = await wait_for(
                    lambda: readiness(http),
                    lambda r: r["worker"]["ok"] and r["worker"]["running_jobs"] == 0,
                    what="the worker to retry the stuck job",
                )
    assert ready["status"] == "ready" and ready["worker"]["live_workers"] >= 1


async def test_readyz_counts_a_job_queued_for_later_as_scheduled_not_waiting(
    settings: Settings, engine: Any, api_key: str
) -> None:
    """A job deferred ten minutes (as an inline erase defers its backup job) is not lag: it is
    counted apart from the jobs waiting for a worker."""
    with run_server(settings) as api:  # no worker: nothing takes the jobs
        async with httpx.AsyncClient(base_url=api.url) as http:
            before = (await readiness(http))["worker"]
            async with transaction(engine) as db:
                args = {"receipt_id": str(uuid.uuid4()), "tenant_id": str(uuid.uuid4())}
                assert await enqueue(db, TaskName.ERASE, args, delay_seconds=600)
            after = (await readiness(http))["worker"]
    assert after["scheduled_jobs"] == before["scheduled_jobs"] + 1
    assert after["pending_jobs"] == before["pending_jobs"]


async def test_a_stalled_job_whose_twin_is_queued_is_failed_not_retried(
    settings: Settings, engine: Any, api_key: str
) -> None:
    """A worker died mid-job and the sweeper queued the same work again (the queueing lock is
    free while the first job is `doing`): the stalled job cannot go back to the queue beside
    its twin, so it is marked failed, and the watcher does not fail on it at every round."""
    pk = uuid.uuid4()
    key = SessionKey(uuid.uuid4(), pk)  # a job of a session that is not there
    async with transaction(engine) as db:
        assert await enqueue_offload(db, key, trigger="test")
        await db.execute(
            text("UPDATE procrastinate_jobs SET status = 'doing' WHERE queueing_lock = :q"),
            {"q": f"offload:{pk}"},
        )
        assert await enqueue_offload(db, key, trigger="sweeper")  # the twin
    job_app = create_job_app(settings)
    async with job_app.open_async():
        assert await retry_stalled_jobs(job_app, stalled_after_seconds=1) >= 1
        assert await retry_stalled_jobs(job_app, stalled_after_seconds=1) == 0
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT status, args->>'trigger' FROM procrastinate_jobs"
                " WHERE queueing_lock = :q ORDER BY id"
            ),
            {"q": f"offload:{pk}"},
        )
        assert [tuple(r) for r in rows] == [("failed", "test"), ("todo", "sweeper")]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
async def test_contextd_worker_stops_gracefully_on_sigint_or_sigterm_even_started_in_the_background(
    settings: Settings, engine: Any, signum: signal.Signals
) -> None:
    """A shell starts a background job with SIGINT ignored (`contextd worker &` in a script),
    and SIGTERM is how docker, systemd and Kubernetes stop a process: either signal stops the
    worker as Ctrl-C does, exiting 0 with its procrastinate workers unregistered (a killed
    worker's rows would stay)."""
    before = await job_worker_ids(engine)
    command = [sys.executable, "-m", "app.runtime.cli", "worker"]
    process = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *command],
        env=worker_env(settings) | {"CONTEXTD_WORKER__SESSION_SLOTS": "1"},
    )
    try:
        registered = await wait_for(
            lambda: job_worker_ids(engine),
            lambda now: len(now - before) == 2,  # its shared slots and its session slot
            what="the worker to register",
        )
        process.send_signal(signum)
        code = await asyncio.to_thread(process.wait, 60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 0
    assert not (registered - before) & await job_worker_ids(engine)


async def test_a_postgres_restart_mid_appends_loses_nothing_and_offloads_resume(
    settings: Settings, stack: EmbeddedStack, engine: Any, api_key: str
) -> None:
    clients, turns_each, restart_after = 3, 40, 12
    statuses: list[int] = []
    acknowledged: dict[int, list[int]] = {c: [] for c in range(clients)}
    progress = {c: 0 for c in range(clients)}
    with run_server(settings, with_worker=True) as server:  # API and worker: `contextd dev`
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
        ) as http:
            for c in range(clients):
                assert (await http.put(f"/v1/sessions/pg-{c}", json=SMALL)).status_code == 200

            async def append_with_retries(c: int, i: int) -> None:
                key = str(uuid.uuid4())  # a retry replays the same append: never twice
                while True:
                    try:
                        resp = await http.post(
                            f"/v1/sessions/pg-{c}/turns",
                            json={"turns": [turn(c, i)]},
                            headers={"Idempotency-Key": key},
                        )
                    except httpx.TransportError:
                        statuses.append(0)
                    else:
                        statuses.append(resp.status_code)
                        if resp.status_code == 201:
                            acknowledged[c].append(resp.json()["turns"][0]["seq"])
                            return
                        assert resp.status_code == 503, resp.text
                        assert resp.headers["Retry-After"]
                    await asyncio.sleep(0.2)  # the client's own backoff before it retries

            async def client(c: int) -> None:
                for i in range(turns_each):
                    await append_with_retries(c, i)
                    progress[c] = i + 1

            async def restart() -> None:
                await wait_for(
                    lambda: asyncio.sleep(0, result=min(progress.values())),
                    lambda done: done >= restart_after,
                    what="appends before the restart",
                )
                await asyncio.to_thread(stack.restart_postgres)

            await asyncio.gather(*(client(c) for c in range(clients)), restart())
            views = await wait_for(
                lambda: asyncio.gather(*(http.get(f"/v1/sessions/pg-{c}") for c in range(clients))),
                lambda vs: all(
                    v.status_code == 200 and v.json()["watermark"]["level"] == "normal" for v in vs
                ),
                timeout=120,
                what="every session back under its trigger (offloads resumed)",
            )
            listed = [
                (await http.get(f"/v1/sessions/pg-{c}/turns", params={"limit": 500})).json()
                for c in range(clients)
            ]
            ready = await wait_for(
                lambda: readiness(http),
                lambda r: r["database"]["ok"] and r["worker"]["ok"],
                what="readiness after the restart",
            )
    assert 500 not in statuses
    for c in range(clients):
        assert acknowledged[c] == list(range(1, turns_each + 1))
        contents = [t["content"] for t in listed[c]["turns"]]
        assert contents == [turn(c, i)["content"] for i in range(turns_each)]
        assert views[c].json()["counts"]["chunks"] > 0
    assert ready["worker"]["live_workers"] >= 1
