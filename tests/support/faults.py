"""Misbehaving services on 127.0.0.1 for fault tests: an embeddings (or chat) endpoint that hangs,
drips a byte at a time, or answers garbage.

`hang` holds each request until `release` is set, then answers well; `drip` sends a 200 head and
then one byte every 0.2 s until `release` is set (a client's read timeout never fires); `garbage`
answers at once with a body that is not an embeddings (or chat) response.
"""

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal

from tests.support.loopback import serving

Mode = Literal["hang", "drip", "garbage"]
DIM = 8  # vector size a `hang` server answers with once released


@dataclass
class FaultyServer:
    url: str
    mode: Mode
    requests: int = 0
    arrived: threading.Event = field(default_factory=threading.Event)  # a request came in
    release: threading.Event = field(default_factory=threading.Event)  # end hanging, dripping


def _embeddings(body: Any) -> dict[str, Any]:
    inputs = body.get("input", []) if isinstance(body, dict) else []
    return {"data": [{"index": i, "embedding": [1.0] * DIM} for i in range(len(inputs))]}


@contextmanager
def faulty_server(mode: Mode) -> Iterator[FaultyServer]:
    state = FaultyServer(url="", mode=mode)

    class _Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            state.requests += 1
            state.arrived.set()
            try:
                if mode == "garbage":
                    self._answer({"data": "not embeddings", "choices": "not a completion"})
                elif mode == "hang":
                    state.release.wait(120)
                    self._answer(_embeddings(json.loads(raw or b"{}")))
                else:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "1000000")
                    self.end_headers()
                    while not state.release.wait(0.2):
                        self.wfile.write(b" ")
                        self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return  # the client gave up, as it should

        def _answer(self, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    with serving(_Handler) as url:
        state.url = url
        try:
            yield state
        finally:
            state.release.set()  # let held requests end before the server shuts down
