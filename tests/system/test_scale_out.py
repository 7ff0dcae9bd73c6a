"""Two API processes and two workers, each a process group of its own, on one PostgreSQL and one
Redis (one Valkey, or a cluster of three primaries): clients spread appends and build-prompts
over both API processes, and mid-run one API process and one worker (holding a job) are
SIGKILLed — on the cluster, one primary too. Clients move to the other API process on a
connection error, replaying the append under its idempotency key; the other worker retries the
killed one's jobs once they stall (`app.runtime.worker.retry_stalled_jobs`).

Then, from the rows: every accepted turn stored exactly once with contiguous seqs, every turn in
at most one chunk and offload events that never cover a turn twice, notes versions that never
went back in what any client saw, and session counters equal to a recount (and no drift repaired
by the sweep on the way)."""

import asyncio
import itertools
import threading
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.store.sessions import session_cache_key
from tests.core.test_cache_cluster import on_cluster
from tests.offload.test_sweep_counters import stored_and_counted
from tests.support.fake_notes_model import reply
from tests.support.loopback import Handler, loopback_server
from tests.support.valkey_cluster import ValkeyCluster, valkey_cluster
from tests.support.waiting import wait_for
from tests.system.deployment import (
    SMALL_WINDOW,
    Deployment,
    Fleet,
    deployment,
    process_env,
    settled,
)

OWN_DATABASE = True  # it runs workers: see tests/conftest.py

SESSIONS = 6
CLIENTS = 8  # sessions 0 and 1 have two clients each, appending concurrently
TURNS = 36  # per client
BUILD_EVERY = 2  # appends per build-prompt


@pytest.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ValkeyCluster]:
    async with valkey_cluster(Path(tmp_path_factory.mktemp("valkey-cluster"))) as running:
        yield running


def gated_notes_model(gate: threading.Event) -> Handler:
    """The notes LLM (`tests.support.fake_notes_model`), holding each request while `gate` is
    closed: a worker that takes a notes job then is in the middle of it when it is killed."""

    def handler(method: str, path: str, body: Any) -> tuple[int, Any]:
        gate.wait(timeout=60)
        return reply(method, path, body)

    return handler


async def tenant_id(engine: AsyncEngine, name: str) -> uuid.UUID:
    async with engine.connect() as conn:
        found = await conn.scalar(text("SELECT id FROM tenants WHERE name = :n"), {"n": name})
    return uuid.UUID(str(found))


async def rows(engine: AsyncEngine, query: str, tenant: uuid.UUID) -> list[Any]:
    async with engine.connect() as conn:
        return list((await conn.execute(text(query), {"t": tenant})).all())


async def jobs_held_by(engine: AsyncEngine, job_workers: set[int]) -> list[int]:
    async with engine.connect() as conn:
        found = await conn.scalars(
            text(
                "SELECT id FROM procrastinate_jobs WHERE status = 'doing' AND worker_id = ANY(:w)"
            ),
            {"w": list(job_workers)},
        )
        return list(found.all())


@dataclass
class PrimaryOutage:
    """On the cluster: the primary killed mid-run, and the cache keys of the session views it
    holds (by session)."""

    cluster: ValkeyCluster
    primary: int
    views: dict[str, str]

    async def refilled(self, fleet: Fleet) -> bool:
        """Reads the views again; True once the restarted primary holds each of them."""
        node = self.cluster.nodes[self.primary]
        async with node.client() as client:
            for sid, key in self.views.items():
                assert (await fleet.call("GET", f"/v1/sessions/{sid}")).status_code == 200
                if not await client.exists(key):
                    return False
        return True


@dataclass
class Kills:
    held_jobs: list[int]  # the jobs the killed worker was running


async def run_with_kills(
    running: Deployment,
    fleet: Fleet,
    engine: AsyncEngine,
    gate: threading.Event,
    outage: PrimaryOutage | None,
) -> Kills:
    sessions = [f"scale-{s}" for s in range(SESSIONS)]
    for sid in sessions:
        assert (await fleet.call("PUT", f"/v1/sessions/{sid}", SMALL_WINDOW)).status_code == 200
    progress = {c: 0 for c in range(CLIENTS)}

    async def turns_done(at_least: int) -> None:
        await wait_for(
            lambda: asyncio.sleep(0, result=min(progress.values())),
            lambda done: done >= at_least,
            timeout=120,
            what=f"every client past turn {at_least}",
        )

    async def kill() -> Kills:
        await turns_done(TURNS // 3)
        gate.clear()  # notes jobs now wait on the model: the victim will be inside one
        victim = running.workers[0]
        held = await wait_for(
            lambda: jobs_held_by(engine, victim.job_workers),
            bool,
            timeout=60,
            what="the worker to be running a job",
        )
        victim.kill()
        running.apis[0].kill()
        if outage is not None:
            outage.cluster.kill(outage.primary)
        gate.set()
        if outage is not None:
            await turns_done(2 * TURNS // 3)
            await outage.cluster.restart(outage.primary)  # back empty
        return Kills(held)

    clients = [
        fleet.run_client(c, sessions[c % SESSIONS], TURNS, BUILD_EVERY, progress)
        for c in range(CLIENTS)
    ]
    *_, kills = await asyncio.gather(*clients, kill())
    assert isinstance(kills, Kills)
    return kills


async def check_rows(engine: AsyncEngine, tenant: uuid.UUID, fleet: Fleet) -> None:
    record = fleet.record
    sent: dict[str, dict[int, str]] = defaultdict(dict)
    for accepted in record.accepted:
        for seq, content in zip(accepted.seqs, accepted.contents, strict=True):
            assert seq not in sent[accepted.session], (accepted.session, seq)
            sent[accepted.session][seq] = content
    assert sum(len(s) for s in sent.values()) == CLIENTS * TURNS

    turns = await rows(
        engine,
        "SELECT s.external_id, t.seq, t.content, t.chunk_id FROM turns t"
        " JOIN sessions s ON s.id = t.session_id WHERE s.tenant_id = :t ORDER BY 1, 2",
        tenant,
    )
    chunks = await rows(
        engine,
        "SELECT s.external_id, c.id, c.turn_first, c.turn_last, c.part, c.parts, c.status"
        " FROM chunks c JOIN sessions s ON s.id = c.session_id WHERE s.tenant_id = :t",
        tenant,
    )
    events = await rows(
        engine,
        "SELECT s.external_id, e.turn_first, e.turn_last, e.turns, e.chunks_offloaded, e.trigger"
        " FROM offload_events e JOIN sessions s ON s.id = e.session_id WHERE s.tenant_id = :t"
        " ORDER BY 1, 2",
        tenant,
    )
    sessions = {
        r[0]: r
        for r in await rows(
            engine,
            "SELECT s.external_id, s.id, s.last_seq, s.offloaded_until_seq, s.notes_version,"
            " coalesce(p.version, 0) FROM sessions s"
            " LEFT JOIN scratchpads p ON p.session_id = s.id WHERE s.tenant_id = :t",
            tenant,
        )
    }
    assert set(sessions) == set(sent)
    for sid, (_, pk, last_seq, offloaded_until, notes_version, pad_version) in sessions.items():
        stored = [(seq, content) for s, seq, content, _ in turns if s == sid]
        # Every accepted turn exactly once, under the seq it was acknowledged with; no other.
        assert stored == sorted(sent[sid].items()), sid
        assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1)) and last_seq == len(
            stored
        )

        # Each turn in at most one chunk (a long turn's parts count as one), ranges disjoint.
        own = [c for c in chunks if c[0] == sid]
        assert all(c[6] == "active" for c in own), sid
        groups: dict[tuple[int, int], list[tuple[uuid.UUID, int, int]]] = defaultdict(list)
        for _, chunk_id, first, last, part, parts, _ in own:
            groups[(first, last)].append((chunk_id, part, parts))
        ranges = sorted(groups)
        for before, after in itertools.pairwise(ranges):
            assert before[1] < after[0], (sid, before, after)
        for group in groups.values():
            assert sorted(p for _, p, _ in group) == list(range(1, group[0][2] + 1)), (sid, group)
        covered = {seq: (first, last) for first, last in ranges for seq in range(first, last + 1)}
        chunk_range = {chunk_id: rng for rng, group in groups.items() for chunk_id, _, _ in group}
        offloaded = [(seq, chunk_id) for s, seq, _, chunk_id in turns if s == sid and chunk_id]
        assert [seq for seq, _ in offloaded] == list(range(1, offloaded_until + 1)), sid
        assert sorted(covered) == [seq for seq, _ in offloaded], sid
        assert all(covered[seq] == chunk_range[chunk_id] for seq, chunk_id in offloaded), sid

        # No offload done twice: events cover disjoint ranges, and add up to the chunk rows.
        done = [e for e in events if e[0] == sid]
        assert done, f"{sid}: no offload happened"
        for before, after in itertools.pairwise(done):
            assert before[2] < after[1], (sid, before, after)
        assert sum(e[3] for e in done) == len(offloaded), sid
        assert sum(e[4] for e in done) == len(own), sid

        # Notes written, and never seen going back by any client.
        assert notes_version == pad_version >= 1, sid
        counters, recount = await stored_and_counted(engine, pk)
        assert counters == recount, sid
    for (client, sid), seen in record.notes_seen.items():
        assert seen == sorted(seen), (client, sid, seen)
        assert seen[-1] <= sessions[sid][4]
    triggers = Counter(e[5] for e in events)
    assert triggers["watermark"] > 0, triggers  # the workers offloaded, not only requests


async def scale_out(
    settings: Settings,
    engine: AsyncEngine,
    api_key: str,
    tenant_name: str,
    log_dir: Path,
    outage: PrimaryOutage | None = None,
) -> None:
    gate = threading.Event()
    gate.set()
    with loopback_server(gated_notes_model(gate)) as llm:
        env = process_env(
            settings,
            CONTEXTD_NOTES__GENERATOR="llm",
            CONTEXTD_NOTES__LLM_BASE_URL=llm.url,
            CONTEXTD_NOTES__LLM_TIMEOUT_SECONDS="90",
        )
        async with deployment(env, log_dir, engine, apis=2, workers=2) as running:
            fleet = Fleet([api.url for api in running.apis], api_key)
            try:
                kills = await run_with_kills(running, fleet, engine, gate, outage)
                tenant = await tenant_id(engine, tenant_name)
                await wait_for(
                    lambda: settled(engine, tenant),
                    lambda state: state == (0, 0, 0),
                    timeout=90,
                    what="the queue to drain and the notes to cover every offload",
                )
                if outage is not None:  # the cache is used again, filled from Postgres
                    await wait_for(
                        lambda: outage.refilled(fleet),
                        bool,
                        timeout=60,
                        interval=0.5,
                        what="the restarted primary to hold the views again",
                    )
            finally:
                await fleet.aclose()
            assert running.workers[1].alive() and running.apis[1].alive()
    assert kills.held_jobs
    async with engine.connect() as conn:
        left = await conn.scalar(
            text(
                "SELECT count(*) FROM procrastinate_jobs WHERE id = ANY(:ids) AND status = 'doing'"
            ),
            {"ids": kills.held_jobs},
        )
    assert left == 0  # the killed worker's jobs were taken up again
    assert fleet.record.failovers > 0  # requests met the killed API process and moved on
    assert [s for s in fleet.record.statuses if s >= 500] == []
    for worker in running.workers:
        assert "counters drifted" not in worker.log.read_text(errors="replace"), worker.name
    await check_rows(engine, tenant, fleet)


async def test_two_apis_and_two_workers_lose_nothing_when_one_of_each_is_killed(
    settings: Settings, engine: AsyncEngine, api_key: str, tenant_name: str, tmp_path: Path
) -> None:
    await scale_out(settings, engine, api_key, tenant_name, tmp_path)


async def test_the_same_on_a_valkey_cluster_with_a_primary_killed(
    settings: Settings,
    engine: AsyncEngine,
    api_key: str,
    tenant_name: str,
    tmp_path: Path,
    cluster: ValkeyCluster,
) -> None:
    own = on_cluster(settings, cluster)
    cache = Cache(cluster.url, own.cache)
    try:
        tenant = await tenant_id(engine, tenant_name)
        views = {
            f"scale-{s}": session_cache_key(cache, tenant, f"scale-{s}") for s in range(SESSIONS)
        }
    finally:
        await cache.aclose()
    primaries = {
        sid: cluster.node_of_slot(await cluster.keyslot(key)) for sid, key in views.items()
    }
    # The primary holding the most of the run's sessions.
    primary, _ = Counter(primaries.values()).most_common(1)[0]
    on_primary = {sid: key for sid, key in views.items() if primaries[sid] == primary}
    await scale_out(
        own, engine, api_key, tenant_name, tmp_path, PrimaryOutage(cluster, primary, on_primary)
    )
