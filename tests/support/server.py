"""Run the real API (and optionally the worker) on a loopback port in a background thread."""

import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp

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
    from app.runtime.cli import _serve

    settings = settings.model_copy(update={"port": free_port(), "host": "127.0.0.1"})
    server_box: dict[str, uvicorn.Server] = {}
    with _in_thread(
        lambda: _serve(settings, with_worker=with_worker, server_box=server_box),  # type: ignore[arg-type]
        server_box,
    ):
        url = f"http://127.0.0.1:{settings.port}"
        _wait_until_up(url)
        yield RunningServer(url=url, settings=settings)


@contextmanager
def serve_app(app: ASGIApp, settings: Settings) -> Iterator[RunningServer]:
    """`app` (e.g. `create_app(settings)` with a test route added) served as `contextd serve`
    serves the API."""
    from app.http.server import uvicorn_config

    settings = settings.model_copy(update={"port": free_port(), "host": "127.0.0.1"})
    server = uvicorn.Server(uvicorn_config(app, settings))
    with _in_thread(server.serve, {"server": server}):
        url = f"http://127.0.0.1:{settings.port}"
        _wait_until_up(url)
        yield RunningServer(url=url, settings=settings)


@contextmanager
def _in_thread(
    main: Callable[[], Coroutine[Any, Any, None]], server_box: dict[str, uvicorn.Server]
) -> Iterator[None]:
    """Run `main()` on an event loop in a background thread; stop `server_box["server"]` after."""
    loop = asyncio.new_event_loop()
    stopped = threading.Event()

    def _run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(main())
        finally:
            loop.close()
            stopped.set()

    thread = threading.Thread(target=_run, daemon=True)
    thread.start()
    try:
        yield
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
