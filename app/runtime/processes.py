"""Child processes that share nothing but PostgreSQL and Redis: `contextd serve --workers N` (N API
processes on one listening socket) and the worker of `contextd dev` (beside the API it serves).

The parent binds the socket, starts the children (spawned: a fresh interpreter each), restarts a
child that dies, and when stopped (`serve`: SIGINT/SIGTERM; `dev`: when its API stops) stops them
all (gracefully, then killed after a grace period). Each API child is a plain `contextd serve`
process: its own event loop, connection pools, query encoder and caches. The per-process caches
stay correct because each value is keyed by the version of what it was built from (the BM25 index
by the session's `chunks_version`), and the shared state lives in Postgres and Redis.

Prometheus metrics are written per process to files in one directory (prometheus_client's
multiprocess mode: `PROMETHEUS_MULTIPROC_DIR` when the deployment sets it, else a temporary one),
so whichever child answers `/metrics` reports the sum of all of them.
"""

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from pathlib import Path

from app.core.config import MULTIPROCESS_DIR_ENV, Settings

logger = logging.getLogger("contextd.processes")
STOP_GRACE_SECONDS = 30.0
# What a child runs until SIGTERM: `contextd serve` with `settings` on the inherited socket, or
# a worker (no socket). A module-level function (a spawned child imports it by name).
ChildTarget = Callable[[Settings, socket.socket | None], None]


@dataclass(frozen=True)
class Child:
    """One child process to keep running: `name` for the log, `target(settings, sock)`."""

    name: str
    target: ChildTarget


class Supervisor:
    """Keeps `children` running until stopped (see the module docstring)."""

    def __init__(self, settings: Settings, children: list[Child]) -> None:
        self.settings = settings
        self.children = children
        self.stopping = threading.Event()
        self._context = multiprocessing.get_context("spawn")
        self._running: list[SpawnProcess] = []

    def _start_child(self, child: Child, sock: socket.socket | None) -> SpawnProcess:
        process = self._context.Process(
            target=child.target, args=(self.settings, sock), name=f"contextd-{child.name}"
        )
        process.start()
        return process

    @contextmanager
    def environment(self) -> Iterator[None]:
        """The children's environment, in this process too while it lasts: one metrics directory
        (prometheus_client reads it when imported: enter this before anything imports it, so
        this process's `/metrics` reports every process)."""
        metrics_dir = os.environ.get(MULTIPROCESS_DIR_ENV) or tempfile.mkdtemp(
            prefix="contextd-metrics-"
        )
        owned = metrics_dir != os.environ.get(MULTIPROCESS_DIR_ENV)
        for stale in Path(metrics_dir).glob("*.db"):  # a previous run's series
            stale.unlink()
        added = {MULTIPROCESS_DIR_ENV: metrics_dir}
        previous = {key: os.environ.get(key) for key in added}
        os.environ.update(added)  # spawned children inherit the environment at start
        try:
            yield
        finally:
            if owned:
                shutil.rmtree(metrics_dir, ignore_errors=True)
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def run(self, sock: socket.socket) -> None:
        """`serve --workers N`: supervise until SIGINT/SIGTERM (`sock` bound by the caller, so a
        busy port fails before anything starts)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stopping.set())
        with self.environment():
            try:
                self._start(sock)
                self._watch(sock)
            finally:
                self._stop_children()
                sock.close()

    @contextmanager
    def alongside(self, start: threading.Event) -> Iterator[None]:
        """`dev`: once `start` is set, the children run (started and watched from a thread)
        while this process does its own work in the body; they are stopped when it ends. Enter
        inside `environment()`."""

        def start_and_watch() -> None:
            while not start.wait(0.1):
                if self.stopping.is_set():
                    return
            self._start(None)
            self._watch(None)

        watcher = threading.Thread(target=start_and_watch, daemon=True)
        watcher.start()
        try:
            yield
        finally:
            self.stopping.set()
            watcher.join()
            self._stop_children()

    def _start(self, sock: socket.socket | None) -> None:
        multiprocessing.allow_connection_pickling()
        self._running = [self._start_child(child, sock) for child in self.children]
        logger.info(
            "started %s",
            ", ".join(child.name for child in self.children),
            extra={"pids": [p.pid for p in self._running]},
        )

    def _watch(self, sock: socket.socket | None) -> None:
        while not self.stopping.wait(0.5):
            for i, process in enumerate(self._running):
                if not process.is_alive() and not self.stopping.is_set():
                    child = self.children[i]
                    logger.error(
                        "%s process %s exited (%s); restarting",
                        child.name,
                        process.pid,
                        process.exitcode,
                    )
                    self._running[i] = self._start_child(child, sock)

    def _stop_children(self) -> None:
        for process in self._running:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        for process in self._running:
            process.join(STOP_GRACE_SECONDS)
            if process.is_alive():
                process.kill()
                process.join()
