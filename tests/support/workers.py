"""`contextd worker` (or any child process) started for a test and stopped after it."""

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def stop(process: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 20) -> None:
    """SIGINT (a clean shutdown), then SIGKILL if it does not end within `timeout` seconds."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@contextmanager
def worker_process(env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A real `contextd worker` process with `env`.

    A separate process: `create_job_app` namespaces the task blueprints in place, so a second
    worker in one process (another test's `run_server(with_worker=True)`) would find no tasks."""
    process = subprocess.Popen([sys.executable, "-m", "app.runtime.cli", "worker"], env=env)
    try:
        yield process
    finally:
        stop(process)
