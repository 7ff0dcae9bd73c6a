"""`contextd serve --workers N`: N API processes on one port, sharing only Postgres and Redis."""

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.core.config import Settings
from tests.support.server import free_port
from tests.support.waiting import wait_for

SMALL = {
    "context_limit": 4000,
    "reserve_tokens": 400,
    "min_recent_turns": 4,
    "min_recent_tokens": 300,
}


@dataclass
class Served:
    url: str
    process: subprocess.Popen[bytes]

    def api_children(self) -> set[int]:
        """The spawned API processes (not multiprocessing's resource tracker)."""
        listed = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
        return {
            int(pid)
            for pid in listed.split()
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
        }


async def answers(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{url}/healthz", timeout=1)).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
async def served(settings: Settings) -> AsyncIterator[Served]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": settings.database_url or "",
        "REDIS_URL": settings.redis_url or "",
        "CONTEXTD_PORT": str(port),
        "CONTEXTD_EMBEDDING__KIND": "none",
        "CONTEXTD_LOG_LEVEL": "WARNING",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "app.runtime.cli", "serve", "--workers", "2"], env=env
    )
    running = Served(f"http://127.0.0.1:{port}", process)
    try:
        await wait_for(lambda: answers(running.url), bool, timeout=120, what="the API to answer")
        yield running
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def one_shot(served: Served, key: str) -> httpx.AsyncClient:
    """A client that opens a new connection per request, so the kernel spreads the requests
    over the processes accepting on the shared socket."""
    return httpx.AsyncClient(
        base_url=served.url,
        headers={"Authorization": f"Bearer {key}", "Connection": "close"},
        timeout=60,
    )


async def test_n_processes_serve_and_report_metrics_together(served: Served, api_key: str) -> None:
    assert len(served.api_children()) == 2
    async with one_shot(served, api_key) as http:
        for _ in range(20):
            assert (await http.get("/healthz")).status_code == 200
        for _ in range(3):  # whichever process answers the scrape counts every process's requests
            text = (await http.get("/metrics")).text
            counted = re.search(
                r'contextd_http_request_duration_seconds_count\{method="GET",route="/healthz",'
                r'status="200"\} (\d+)',
                text,
            )
            assert counted is not None and int(float(counted.group(1))) >= 20


async def test_forget_reaches_the_caches_of_every_process(served: Served, admin_key: str) -> None:
    sid, marker = f"workers-{uuid.uuid4().hex[:6]}", f"vx{uuid.uuid4().hex[:8]}"
    async with one_shot(served, admin_key) as http:
        assert (await http.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
        turns = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"filler turn {i} " * 30}
            for i in range(30)
        ]
        turns[2] = {"role": "user", "content": f"The vault code is {marker}, keep it safe."}
        assert (await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).is_success
        offload = await http.post(f"/v1/sessions/{sid}/memory", json={"type": "offload"})
        assert offload.status_code == 200, offload.text

        async def recalled() -> list[str]:
            texts = []
            for _ in range(12):  # new connections: every process builds its own BM25 index
                body = (
                    await http.post(
                        f"/v1/sessions/{sid}/build-prompt",
                        json={"query": f"what is the vault code {marker}?"},
                    )
                ).json()
                texts.append(" ".join(str(m["content"]) for m in body["messages"][:-1]))
            return texts

        assert all(marker in text for text in await recalled())
        found = await http.post(
            f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": marker}
        )
        chunk_id = found.json()["data"]["matches"][0]["chunk_id"]
        forgot = await http.post(
            f"/v1/sessions/{sid}/memory", json={"type": "forget", "chunk_id": chunk_id}
        )
        assert forgot.status_code == 200, forgot.text
        assert not any(marker in text for text in await recalled())


async def test_a_process_that_dies_is_replaced(served: Served) -> None:
    before = served.api_children()
    victim = min(before)
    os.kill(victim, signal.SIGKILL)

    async def replaced() -> set[int]:
        return served.api_children()

    after = await wait_for(
        replaced, lambda pids: len(pids) == 2 and victim not in pids, timeout=120, what="respawn"
    )
    assert after & before == before - {victim}
    await wait_for(lambda: answers(served.url), bool, timeout=60, what="the API to answer")
