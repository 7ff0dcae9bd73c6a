"""Read replicas (`DATABASE_REPLICA_URL`), against a real streaming replica of the suite's embedded
PostgreSQL on loopback (`tests.support.replica`), started once for the module.

The read-only endpoints read from the replica while it is up and not lagging past its bound;
appends and build-prompt stay on the primary; a replica stopped or lagging leaves the reads on the
primary. Which server a read used is told by `contextd_db_reads_total`, and shown by pausing the
replica's replay: a GET served by the replica then misses the turn just appended."""

import re
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from app.core.config import Settings
from app.runtime.embedded import EmbeddedStack
from tests.support.replica import StreamingReplica
from tests.support.server import RunningServer, run_server
from tests.support.waiting import wait_for

CHECK_SECONDS = 0.1  # the replica's lag measured this often, so the tests see a change at once


@pytest.fixture(scope="module")
def replica(stack: EmbeddedStack) -> Iterator[StreamingReplica]:
    with tempfile.TemporaryDirectory(prefix="contextd-replica-") as root:
        started = StreamingReplica(stack.database_url, stack.data_dir.resolve() / "pg", Path(root))
        started.start()
        try:
            yield started
        finally:
            started.stop()


def with_replica(settings: Settings, replica: StreamingReplica, max_lag: float) -> Settings:
    db = settings.db.model_copy(
        update={"replica_max_lag_seconds": max_lag, "replica_check_seconds": CHECK_SECONDS}
    )
    return settings.model_copy(update={"database_replica_url": replica.url, "db": db})


@pytest.fixture(scope="module")
def patient(settings: Settings, replica: StreamingReplica) -> Iterator[RunningServer]:
    """The API with the replica, reading from it while it is at most an hour behind."""
    with run_server(with_replica(settings, replica, 3600)) as running:
        yield running


@pytest.fixture(scope="module")
def strict(settings: Settings, replica: StreamingReplica) -> Iterator[RunningServer]:
    """The API with the replica, passing it over once it is half a second behind."""
    with run_server(with_replica(settings, replica, 0.5)) as running:
        yield running


async def http_of(server: RunningServer, api_key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    )


@pytest.fixture
async def patient_http(patient: RunningServer, api_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with await http_of(patient, api_key) as http:
        yield http


@pytest.fixture
async def strict_http(strict: RunningServer, api_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with await http_of(strict, api_key) as http:
        yield http


async def reads(http: httpx.AsyncClient) -> dict[str, int]:
    """`contextd_db_reads_total` by server, as the API's /metrics reports it."""
    text = (await http.get("/metrics")).text
    found = re.findall(r'contextd_db_reads_total\{server="(\w+)"\} ([0-9.e+]+)', text)
    return {server: int(float(count)) for server, count in found}


async def append(http: httpx.AsyncClient, sid: str, content: str) -> None:
    resp = await http.post(
        f"/v1/sessions/{sid}/turns", json={"turns": [{"role": "user", "content": content}]}
    )
    assert resp.status_code in (200, 201), resp.text


async def read_then_count(http: httpx.AsyncClient, sid: str) -> dict[str, int]:
    """One GET of `sid`'s turns, then `reads`."""
    await turn_texts(http, sid)
    return await reads(http)


async def turn_texts(http: httpx.AsyncClient, sid: str) -> list[str]:
    resp = await http.get(f"/v1/sessions/{sid}/turns")
    assert resp.status_code == 200, resp.text
    return [turn["content"] for turn in resp.json()["turns"]]


async def set_replay(replica: StreamingReplica, paused: bool) -> None:
    """Pause or resume the replica's replay; a pause is waited for (it is only requested)."""
    async with await psycopg.AsyncConnection.connect(replica.url, autocommit=True) as conn:
        await conn.execute(f"SELECT pg_wal_replay_{'pause' if paused else 'resume'}()")

        async def state() -> str:
            row = await (await conn.execute("SELECT pg_get_wal_replay_pause_state()")).fetchone()
            assert row is not None
            return str(row[0])

        await wait_for(state, lambda s: s == ("paused" if paused else "not paused"), what="replay")


def in_recovery(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    assert row is not None
    return bool(row[0])


async def test_reads_come_from_the_replica_and_writes_and_builds_from_the_primary(
    patient_http: httpx.AsyncClient, replica: StreamingReplica, settings: Settings
) -> None:
    assert in_recovery(replica.url) and not in_recovery(settings.database_url or "")
    sid = f"replica-{uuid.uuid4().hex[:8]}"
    first, second = "订单 A-1042 已发货，预计周五到达。", "The refund for order B-77 was approved."
    await append(patient_http, sid, first)
    # Streamed and replayed within moments: the GET, served by the replica, shows the append.
    await wait_for(
        lambda: turn_texts(patient_http, sid), lambda t: t == [first], timeout=30, what="replay"
    )
    before = await reads(patient_http)
    await set_replay(replica, paused=True)
    try:
        await append(patient_http, sid, second)  # the primary takes the write
        assert await turn_texts(patient_http, sid) == [first]  # the paused replica's answer
        built = await patient_http.post(
            f"/v1/sessions/{sid}/build-prompt", json={"query": "Which refund was approved?"}
        )
        assert built.status_code == 200, built.text
        shown = " ".join(str(m["content"]) for m in built.json()["messages"])
        assert first in shown and second in shown  # build-prompt reads its own writes
    finally:
        await set_replay(replica, paused=False)
    await wait_for(
        lambda: turn_texts(patient_http, sid),
        lambda t: t == [first, second],
        timeout=30,
        what="the replay to resume",
    )
    after = await reads(patient_http)
    assert after["replica"] > before["replica"] and after["primary"] == before["primary"]


async def test_a_replica_lagging_past_its_bound_leaves_the_reads_on_the_primary(
    strict_http: httpx.AsyncClient, replica: StreamingReplica
) -> None:
    sid = f"lagging-{uuid.uuid4().hex[:8]}"
    await append(strict_http, sid, "first turn, replayed")
    await wait_for(
        lambda: read_then_count(strict_http, sid), lambda r: r["replica"] > 0, what="a replica read"
    )
    await set_replay(replica, paused=True)
    try:
        await append(strict_http, sid, "第二条：副本还没有重放")
        before = await reads(strict_http)
        # Half a second behind, the replica is passed over: the GET shows the new turn.
        texts = await wait_for(
            lambda: turn_texts(strict_http, sid), lambda t: len(t) == 2, what="primary reads"
        )
        assert texts[1] == "第二条：副本还没有重放"
        assert (await reads(strict_http))["primary"] > before["primary"]
    finally:
        await set_replay(replica, paused=False)
    before = await reads(strict_http)
    await wait_for(
        lambda: read_then_count(strict_http, sid),
        lambda r: r["replica"] > before["replica"],
        what="reads back on the caught-up replica",
    )


async def test_a_stopped_replica_leaves_the_reads_on_the_primary(
    patient_http: httpx.AsyncClient, replica: StreamingReplica
) -> None:
    sid = f"stopped-{uuid.uuid4().hex[:8]}"
    await append(patient_http, sid, "before the replica stopped")
    await wait_for(lambda: turn_texts(patient_http, sid), lambda t: len(t) == 1, what="replay")
    replica.stop()
    try:
        await append(patient_http, sid, "written while the replica is down")
        before = await reads(patient_http)
        for _ in range(3):  # each finds it gone, or goes by the last verdict
            assert len(await turn_texts(patient_http, sid)) == 2
        session = await patient_http.get(f"/v1/sessions/{sid}")
        assert session.status_code == 200 and session.json()["counts"]["turns"] == 2
        after = await reads(patient_http)
        assert after["primary"] == before["primary"] + 4
        assert after["replica"] == before["replica"]
    finally:
        replica.start()
    await wait_for(
        lambda: turn_texts(patient_http, sid), lambda t: len(t) == 2, what="the replica back"
    )
    before = await reads(patient_http)
    await wait_for(
        lambda: read_then_count(patient_http, sid),
        lambda r: r["replica"] > before["replica"],
        what="reads back on the replica",
    )
