"""`contextd dev` runs its worker in a process of its own beside the API (sharing only PostgreSQL
and Valkey): the offload an append enqueues is done there, a worker that dies is replaced, and
stopping dev stops it."""

import asyncio
import os
import re
import signal
from pathlib import Path
from typing import Any

import httpx

from tests.support.dev import DevServer, dev_server
from tests.support.server import free_port
from tests.support.waiting import wait_for

SMALL = {"context_limit": 3000, "reserve_tokens": 200, "min_recent_turns": 2}


def proc_bytes(path: str) -> bytes:
    """A /proc file's bytes, or b"" when its process or thread ended since it was listed (the
    killed worker is listed until its parent reaps it)."""
    try:
        return Path(path).read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def worker_processes(dev: DevServer) -> set[int]:
    """The spawned children of `contextd dev` (not its embedded PostgreSQL and Valkey, nor
    multiprocessing's resource tracker)."""
    # A child is listed under the thread that started it: a replaced worker under the watcher's.
    tasks = Path(f"/proc/{dev.process.pid}/task").glob("*/children")
    return {
        int(child)
        for listed in tasks
        for child in proc_bytes(str(listed)).split()
        if b"spawn_main" in proc_bytes(f"/proc/{int(child)}/cmdline")
    }


async def offloads_counted(http: httpx.AsyncClient) -> float:
    """`contextd_offloads_total` of every trigger, as the API's `/metrics` reports it."""
    text = (await http.get("/metrics")).text
    return sum(
        float(n) for n in re.findall(r"^contextd_offloads_total\{[^}]*\} (\S+)$", text, re.M)
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def offloaded_by_the_worker(http: httpx.AsyncClient, sid: str, marker: str) -> None:
    """Append one ~100-token turn at a time until an append enqueues the offload job (the window
    at the 0.80 trigger, below the emergency ratio at which the append would offload itself),
    then wait for the worker to move turns into chunks; the marker's turn is recalled from them."""
    assert (await http.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    first = {"role": "user", "content": f"The locker code is {marker}. 储物柜密码是{marker}。"}
    assert (await http.post(f"/v1/sessions/{sid}/turns", json={"turns": [first]})).is_success
    for i in range(60):
        turn = {"role": "assistant" if i % 2 else "user", "content": f"filler turn {i} " * 30}
        appended = (await http.post(f"/v1/sessions/{sid}/turns", json={"turns": [turn]})).json()
        if appended["offload_enqueued"]:
            assert appended["watermark"]["level"] != "emergency"
            break
    else:
        raise AssertionError("no append enqueued an offload")

    async def session() -> dict[str, Any]:
        info: dict[str, Any] = (await http.get(f"/v1/sessions/{sid}")).json()
        return info

    info = await wait_for(
        session,
        lambda s: s["counts"]["chunks"] > 0 and s["watermark"]["level"] == "normal",
        timeout=120,
        what="the worker's offload",
    )
    assert info["last_offload_at"] is not None
    found = await http.post(
        f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": f"locker code {marker}"}
    )
    assert found.status_code == 200, found.text
    assert any(marker in m["text"] for m in found.json()["data"]["matches"])


def test_dev_runs_the_worker_in_a_process_of_its_own(tmp_path: Path) -> None:
    with dev_server(tmp_path, free_port()) as dev:

        async def scenario() -> tuple[int, int]:
            async with httpx.AsyncClient(base_url=dev.url, timeout=60) as http:

                async def ready() -> dict[str, Any]:
                    body: dict[str, Any] = (await http.get("/readyz")).json()
                    return body

                # The worker starts once the API answers, in a child process; the API's process
                # runs none, so the two /readyz counts are the child's (its shared slots and
                # those kept for sessions' jobs: `app.runtime.worker`).
                await wait_for(ready, lambda r: r["worker"]["live_workers"] == 2, what="the worker")
                (first,) = worker_processes(dev)
                await offloaded_by_the_worker(http, "dev-worker-a", "kx4417")
                # The worker's series reach the API's /metrics (one metrics directory).
                assert await offloads_counted(http) >= 1

                os.kill(first, signal.SIGKILL)  # a crashed worker is replaced
                replaced = await wait_for(
                    lambda: asyncio.to_thread(worker_processes, dev),
                    lambda pids: len(pids) == 1 and first not in pids,
                    timeout=60,
                    what="a new worker process",
                )
                await offloaded_by_the_worker(http, "dev-worker-b", "qz9052")
                assert await offloads_counted(http) >= 2  # the dead worker's count is kept
                return first, replaced.pop()

        first, second = asyncio.run(scenario())
    printed = "".join(dev.lines)
    assert dev.process.returncode == 0
    assert f"worker process {first} exited (-9); restarting" in printed  # the crash is reported
    assert "contextd dev stopped" in printed
    assert not alive(second)
