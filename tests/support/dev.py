"""`contextd dev` as a user runs it: a subprocess in a directory of its own, stopped with Ctrl-C."""

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.workers import stop

CONTEXTD = str(Path(sys.executable).with_name("contextd"))


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no database or Redis configured, no test settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTD_")}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def contextd(
    cwd: Path, *args: str, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """`contextd *args` run from `cwd` in a user's environment (plus `env`)."""
    return subprocess.run(
        [CONTEXTD, *args],
        cwd=cwd,
        env=user_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class DevServer:
    url: str
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)


@contextmanager
def dev_server(
    cwd: Path, port: int, *args: str, timeout: float = 120, quiet: bool = True
) -> Iterator[DevServer]:
    """Start `contextd dev --port PORT ARGS` in `cwd`; yield once it printed "ready". `quiet`:
    warnings only, in plain text; else the log a user sees (the default settings)."""
    logs = {"CONTEXTD_LOG_FORMAT": "text", "CONTEXTD_LOG_LEVEL": "WARNING"} if quiet else {}
    process = subprocess.Popen(
        [CONTEXTD, "dev", "--port", str(port), *args],
        cwd=cwd,
        env=user_env(**logs),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    output: queue.Queue[str] = queue.Queue()
    server = DevServer(url=f"http://127.0.0.1:{port}", process=process)

    def _read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.put(line)
            server.lines.append(line)

    threading.Thread(target=_read, daemon=True).start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                line = output.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                printed = "".join(server.lines)
                raise AssertionError(f"contextd dev not ready in {timeout}s: {printed}") from None
            if "contextd dev ready" in line:
                break
            if process.poll() is not None and output.empty():
                raise AssertionError(f"contextd dev exited: {''.join(server.lines)}")
        yield server
    finally:
        stop(process, timeout=60)
