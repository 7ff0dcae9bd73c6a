"""Scripted sessions through the real service, for the recall sets of `benchmarks.crosslang` and
`benchmarks.no_history`: an embedded stack with the API and a worker (one embedder per stack),
sessions appended over HTTP and offloaded with the memory tool, their chunks' vectors awaited,
then questions asked through the memory tool's `recall`."""

import asyncio
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from app.core.config import load_settings
from app.core.migrate import upgrade
from app.runtime.embedded import EmbeddedStack
from benchmarks.memory_tool import make_key
from tests.support.server import run_server

# A small window with low floors (as `contextd eval` sets them), so that nearly every turn of a
# scripted session is offloaded.
SESSION_CONFIG = {
    "context_limit": 4000,
    "reserve_tokens": 500,
    "min_recent_turns": 4,
    "min_recent_tokens": 200,
}
EMBED_TIMEOUT_S = 600.0


@contextmanager
def served(embedding_kind: str) -> Iterator[tuple[str, str]]:
    """(base URL, API key) of a fresh contextd with `embedding_kind` ("e5", "use" or "none")."""
    with tempfile.TemporaryDirectory(prefix="contextd-bench-") as tmp:
        stack = EmbeddedStack(Path(tmp), persist=False).start()
        try:
            upgrade(stack.database_url)
            settings = load_settings(
                database_url=stack.database_url,
                redis_url=stack.redis_url,
                embedding={"kind": embedding_kind},
            )
            key = asyncio.run(make_key(stack.database_url))
            with run_server(settings, with_worker=True) as server:
                yield server.url, key
        finally:
            stack.stop()


def client(url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


async def load_session(
    http: httpx.AsyncClient, sid: str, turns: Sequence[dict[str, str]], *, embedded: bool
) -> list[int]:
    """Append `turns` to a new session `sid`, offload all but the window's floors and, when the
    service embeds, wait until every chunk has its vector. Returns the turns' seqs, in order."""
    (await http.put(f"/v1/sessions/{sid}", json=SESSION_CONFIG)).raise_for_status()
    seqs: list[int] = []
    for start in range(0, len(turns), 100):
        resp = await http.post(
            f"/v1/sessions/{sid}/turns", json={"turns": turns[start : start + 100]}
        )
        resp.raise_for_status()
        seqs.extend(t["seq"] for t in resp.json()["turns"])
    resp = await http.post(
        f"/v1/sessions/{sid}/memory", json={"type": "offload", "until_tokens": 0}
    )
    resp.raise_for_status()
    deadline = time.monotonic() + EMBED_TIMEOUT_S
    while embedded:
        resp = await http.get(f"/v1/sessions/{sid}/chunks", params={"limit": 500})
        chunks = resp.json()["chunks"]
        if chunks and all(c["embedded"] for c in chunks):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"chunks of {sid} not embedded after {EMBED_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.5)
    return seqs


async def offloaded_until(http: httpx.AsyncClient, sid: str) -> int:
    """The last seq of `sid` that left the window."""
    resp = await http.post(f"/v1/sessions/{sid}/memory", json={"type": "status"})
    resp.raise_for_status()
    return int(resp.json()["data"]["offloaded_until_seq"])


async def recall(
    http: httpx.AsyncClient, sid: str, query: str, top_k: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """The memory tool's matches for `query`, best first, and the recall's fallbacks
    (`vector_timeout`, `vector_unavailable`: the question was searched lexically only)."""
    resp = await http.post(
        f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": query, "top_k": top_k}
    )
    resp.raise_for_status()
    data = resp.json()["data"]
    return data["matches"], data["fallbacks"]
