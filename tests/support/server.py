"""Run the real API (and optionally the worker) on a loopback port in a background thread."""

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn

from app.core.config import Settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningServer:
    url: str
    settings: Settings


@contextmanager
def run_server(settings: Settings, *, with_worker: bool = False) -> Iterator[RunningServer]:
    from app.cli import _serve

    port = free_port()
    settings = settings.model_copy(update={"port": port, "host": "127.0.0.1"})
    loop = asyncio.new_event_loop()
    stopped = threading.Event()
    server_box: dict[str, uvicorn.Server] = {}

    def _run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(
                _serve(settings, with_worker=with_worker, server_box=server_box)
            )
        finally:
            loop.close()
            stopped.set()

    thread = threading.Thread(target=_run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    _wait_until_up(url)
    try:
        yield RunningServer(url=url, settings=settings)
    finally:
        server = server_box.get("server")
        if server is not None:
            server.should_exit = True
        stopped.wait(timeout=30)


def _wait_until_up(url: str, attempts: int = 200) -> None:
    for _ in range(attempts):
        try:
            if httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200:
                return
        except httpx.TransportError:
            threading.Event().wait(0.05)
    raise RuntimeError(f"server at {url} did not come up")
