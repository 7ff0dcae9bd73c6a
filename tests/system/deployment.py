"""A deployment of real processes on one PostgreSQL and one Redis: API processes (`contextd
serve`) and workers (`contextd worker`), each a process group of its own that a test can SIGKILL,
and a fleet of clients that spread appends and build-prompts over the API processes, moving to
another one when a connection fails.

Used by tests/system/test_scale_out.py (with kills) and benchmarks/scale_out.py (without)."""

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from tests.offload.test_worker import worker_env
from tests.support.server import free_port
from tests.support.waiting import wait_for
from tests.support.workers import stop

# A window this small fills after ~20 turns of `client_turn`: offloads and notes refreshes
# happen several times per session within a short run.
SMALL_WINDOW = {"context_limit": 1600, "reserve_tokens": 200, "min_recent_turns": 2}


def process_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of an API process or worker on `settings`' database and Redis."""
    env = worker_env(settings) | {"CONTEXTD_HOST": "127.0.0.1"}
    if settings.cache.cluster:
        env["CONTEXTD_CACHE__CLUSTER"] = "true"
    return env | extra


@dataclass
class Member:
    """One process of the deployment, the leader of its own process group."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    url: str = ""
    job_workers: set[int] = field(default_factory=set)  # its rows in procrastinate_workers

    def kill(self) -> None:
        """SIGKILL the whole group: no shutdown, no cleanup, like a lost host."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def alive(self) -> bool:
        return self.process.poll() is None


async def answers(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{url}/healthz", timeout=1)).status_code == 200
    except httpx.TransportError:
        return False


async def job_worker_ids(engine: AsyncEngine) -> set[int]:
    async with engine.connect() as conn:
        return set((await conn.scalars(text("SELECT id FROM procrastinate_workers"))).all())


class Deployment:
    def __init__(self, env: dict[str, str], log_dir: Path, engine: AsyncEngine) -> None:
        self.env, self.log_dir, self.engine = env, log_dir, engine
        self.apis: list[Member] = []
        self.workers: list[Member] = []

    def _launch(self, name: str, args: list[str], env: dict[str, str]) -> Member:
        log = self.log_dir / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "app.runtime.cli", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group of its own
            )
        return Member(name, process, log)

    async def start_apis(self, count: int) -> None:
        started = []
        for _ in range(count):
            port = free_port()
            member = self._launch(
                f"api-{len(self.apis)}", ["serve"], self.env | {"CONTEXTD_PORT": str(port)}
            )
            member.url = f"http://127.0.0.1:{port}"
            self.apis.append(member)
            started.append(member)
        for member in started:
            await wait_for(
                partial(answers, member.url), bool, timeout=120, what=f"{member.name} to answer"
            )

    async def start_worker(self) -> Member:
        """One worker, started once the ones before it registered: the rows it adds to
        procrastinate_workers are its own."""
        before = await job_worker_ids(self.engine)
        member = self._launch(f"worker-{len(self.workers)}", ["worker"], self.env)
        self.workers.append(member)
        slots = 2 if int(self.env.get("CONTEXTD_WORKER__SESSION_SLOTS", "1")) else 1
        ids = await wait_for(
            lambda: job_worker_ids(self.engine),
            lambda now: len(now - before) >= slots,
            timeout=120,
            what=f"{member.name} to register",
        )
        member.job_workers = ids - before
        return member

    def stop(self) -> None:
        for member in self.apis + self.workers:
            stop(member.process)


@asynccontextmanager
async def deployment(
    env: dict[str, str], log_dir: Path, engine: AsyncEngine, apis: int, workers: int
) -> AsyncIterator[Deployment]:
    running = Deployment(env, log_dir, engine)
    try:
        await running.start_apis(apis)
        for _ in range(workers):
            await running.start_worker()
        yield running
    finally:
        running.stop()


async def settled(
    engine: AsyncEngine, tenant: uuid.UUID, embedding: bool = False
) -> tuple[int, int, int]:
    """(jobs queued or running, the tenant's sessions whose notes do not yet cover their
    offloaded turns, its chunks still waiting for a vector when `embedding`)."""
    async with engine.connect() as conn:
        busy = await conn.scalar(
            text("SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')")
        )
        stale = await conn.scalar(
            text(
                "SELECT count(*) FROM sessions s LEFT JOIN scratchpads p ON p.session_id = s.id"
                " WHERE s.tenant_id = :t"
                " AND coalesce(p.covers_until_seq, 0) < s.offloaded_until_seq"
            ),
            {"t": tenant},
        )
        unembedded = (
            await conn.scalar(
                text("SELECT count(*) FROM chunks WHERE tenant_id = :t AND embedding IS NULL"),
                {"t": tenant},
            )
            if embedding
            else 0
        )
    return int(busy or 0), int(stale or 0), int(unembedded or 0)


def client_turn(client: int, i: int) -> dict[str, Any]:
    return {
        "role": "user" if i % 2 == 0 else "assistant",
        "content": f"client {client} turn {i}: 订单 AB-{client}{i:03d} ships to Lyon by train, "
        "window seat, budget at most 120 EUR, the 猫 travels too. " * 2,
    }


@dataclass
class Accepted:
    """An append the API acknowledged (201): what was sent and the seqs it was given."""

    session: str
    contents: list[str]
    seqs: list[int]
    acked_at: float
    offload_enqueued: bool


@dataclass
class Record:
    accepted: list[Accepted] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    failovers: int = 0  # requests sent again to another API process after a transport error
    append_ms: list[float] = field(default_factory=list)
    build_ms: list[float] = field(default_factory=list)
    # The notes version each build-prompt answered, per (client, session), in the order asked.
    notes_seen: dict[tuple[int, str], list[int]] = field(default_factory=dict)


class Fleet:
    """Clients of the API processes at `urls`; a request goes to the next process in turn, and
    on a transport error (the process died mid-request, or is gone) to the one after it."""

    def __init__(self, urls: list[str], api_key: str, deadline_seconds: float = 60) -> None:
        self.urls = urls
        self.deadline_seconds = deadline_seconds
        self.http = {
            url: httpx.AsyncClient(
                base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
            )
            for url in urls
        }
        self.record = Record()
        self._turn = 0

    async def aclose(self) -> None:
        for http in self.http.values():
            await http.aclose()

    async def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        self._turn += 1
        deadline = time.monotonic() + self.deadline_seconds
        attempt = 0
        while True:
            url = self.urls[(self._turn + attempt) % len(self.urls)]
            attempt += 1
            try:
                resp = await self.http[url].request(method, path, json=body, headers=headers)
            except httpx.TransportError:
                self.record.failovers += 1
            else:
                self.record.statuses.append(resp.status_code)
                if resp.status_code != 503:
                    return resp
            if time.monotonic() > deadline:
                raise AssertionError(f"{method} {path}: no API process answered in time")
            if attempt % len(self.urls) == 0:
                await asyncio.sleep(0.1)  # the client's own backoff once every process failed

    async def append(self, session: str, turns: list[dict[str, Any]]) -> Accepted:
        # One key per append: a retry on another process replays it, never stores it twice.
        key = str(uuid.uuid4())
        started = time.perf_counter()
        resp = await self.call(
            "POST", f"/v1/sessions/{session}/turns", {"turns": turns}, {"Idempotency-Key": key}
        )
        assert resp.status_code == 201, resp.text
        self.record.append_ms.append((time.perf_counter() - started) * 1000)
        body = resp.json()
        accepted = Accepted(
            session,
            [t["content"] for t in turns],
            [t["seq"] for t in body["turns"]],
            time.time(),
            body["offload_enqueued"],
        )
        self.record.accepted.append(accepted)
        return accepted

    async def build(self, client: int, session: str, query: str) -> dict[str, Any]:
        started = time.perf_counter()
        resp = await self.call("POST", f"/v1/sessions/{session}/build-prompt", {"query": query})
        assert resp.status_code == 200, resp.text
        self.record.build_ms.append((time.perf_counter() - started) * 1000)
        body: dict[str, Any] = resp.json()
        self.record.notes_seen.setdefault((client, session), []).append(body["notes_version"])
        return body

    async def run_client(
        self,
        client: int,
        session: str,
        turns: int,
        build_every: int,
        progress: dict[int, int],
        pace_seconds: float = 0,
    ) -> None:
        """`turns` turns appended one or two at a time, a build-prompt every `build_every`
        appends, an append every `pace_seconds` at most (0: each right after the one before);
        `progress[client]` counts the turns appended so far."""
        i, step = 0, 0
        due = time.monotonic()
        while i < turns:
            if pace_seconds:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                due += pace_seconds
            batch = [client_turn(client, j) for j in range(i, min(turns, i + 1 + step % 2))]
            await self.append(session, batch)
            i += len(batch)
            progress[client] = i
            step += 1
            if build_every and step % build_every == 0:
                await self.build(client, session, f"Which order ships to Lyon? AB-{client}{i:03d}")
