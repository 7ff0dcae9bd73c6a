"""A real HTTP server on 127.0.0.1 for tests that exercise remote APIs (LLM, embeddings, rerank).

Each test gives a handler `(method, path, json_body) -> (status, json_body)`; the server records
every request so tests can assert what the service sent.
"""

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from app.core.config import Settings

Handler = Callable[[str, str, Any], tuple[int, Any]]


@dataclass
class LoopbackServer:
    url: str
    requests: list[tuple[str, str, Any]] = field(default_factory=list)


@contextmanager
def serving(handler_class: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler_class` on 127.0.0.1 (a free port) in a thread; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def loopback_server(handler: Handler) -> Iterator[LoopbackServer]:
    record = LoopbackServer(url="")

    class _RequestHandler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            record.requests.append((self.command, self.path, body))
            status, payload = handler(self.command, self.path, body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = _serve
        do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return

    with serving(_RequestHandler) as url:
        record.url = url
        yield record


def closed_port_url() -> str:
    """A loopback URL on which nothing listens (bind, read the port, close)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def with_openai_embedder(settings: Settings, url: str, **embedding: Any) -> Settings:
    """`settings` with an OpenAI-style embedder (8-d) at `url`, plus any other embedding fields."""
    return settings.model_copy(
        update={
            "embedding": settings.embedding.model_copy(
                update={"kind": "openai", "openai_base_url": url, "openai_dim": 8, **embedding}
            )
        }
    )
