"""Slow clients are cut off, failures answer JSON without dropping the connection, and an
unreachable database is a 503 the client may retry. Spoken over raw sockets, so the test sees
exactly what the server does with the connection."""

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

import httpx
from fastapi import FastAPI
from starlette.background import BackgroundTask
from starlette.responses import Response

from app.core.config import Settings, load_settings
from app.http.server import OneSendTransport
from app.runtime.api import create_app
from tests.support.loopback import closed_port_url
from tests.support.server import RunningServer, run_server, serve_app
from tests.support.waiting import wait_for

DEADLINE = 20.0  # seconds a test waits for the server to act; the server's timeouts are 0.5 s
FAST_TIMEOUTS = {"header_timeout_seconds": 0.5, "body_timeout_seconds": 0.5}


def fast(settings: Settings, **changes: object) -> Settings:
    server = settings.server.model_copy(update=FAST_TIMEOUTS)
    return settings.model_copy(update={"server": server, **changes})


@contextmanager
def connect(server: RunningServer) -> Iterator[socket.socket]:
    url = urlparse(server.url)
    with socket.create_connection((url.hostname, url.port), timeout=DEADLINE) as sock:
        yield sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response; got {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a response body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    """Waits (at most DEADLINE) for the server to close; True once it has."""
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_a_half_sent_head_or_a_silent_connection_is_closed(settings: Settings) -> None:
    with run_server(fast(settings)) as server:
        with connect(server) as silent:
            assert closed_by_server(silent)
        with connect(server) as half:
            half.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")
            assert closed_by_server(half)
        with connect(server) as second:  # the same after a first request on the connection
            second.sendall(request("GET", "/healthz"))
            assert read_response(second)[0] == 200
            second.sendall(b"GET /healthz HTTP/1.1\r\n")
            assert closed_by_server(second)


def test_a_dripping_body_gets_a_408_and_the_connection_closes(
    settings: Settings, api_key: str
) -> None:
    with run_server(fast(settings)) as server, connect(server) as sock:
        head = request(
            "POST",
            "/v1/sessions/drip/turns",
            Authorization=f"Bearer {api_key}",
            Content_Type="application/json",
        )
        sock.sendall(head.replace(b"Content-Length: 0", b"Content-Length: 100") + b"{")
        status, headers, body = read_response(sock)
        assert status == 408
        assert json.loads(body)["error"]["code"] == "request_timeout"
        assert headers["connection"] == "close"
        assert closed_by_server(sock)


def test_a_body_over_the_limit_sent_with_connection_close_still_gets_its_413(
    settings: Settings, api_key: str
) -> None:
    """Python's urllib and HTTP/1.0 clients ask to close after the answer and send their whole
    body before reading: the server must not close with the body unread (the kernel would reset
    the connection and the client lose the 413), but read the rest and drop it."""
    limits = settings.limits.model_copy(update={"max_body_bytes": 1024})
    body = b'{"turns": [{"role": "user", "content": "' + b"x" * 10_000_000 + b'"}]}'
    with run_server(fast(settings, limits=limits)) as server:
        for closing in ("close", "keep-alive"):
            with connect(server) as sock:
                sock.sendall(
                    request(
                        "POST",
                        "/v1/sessions/huge/turns",
                        body,
                        Authorization=f"Bearer {api_key}",
                        Content_Type="application/json",
                        Connection=closing,
                    )
                )
                status, _, answer = read_response(sock)
                assert (closing, status) == (closing, 413)
                assert json.loads(answer)["error"]["code"] == "payload_too_large"
                if closing == "close":
                    assert closed_by_server(sock)
                else:  # the rest of the body was dropped and the connection serves on
                    sock.sendall(request("GET", "/healthz"))
                    assert read_response(sock)[0] == 200


async def test_a_client_that_leaves_inside_its_body_is_counted_499_not_an_error(
    settings: Settings, api_key: str
) -> None:
    route = 'route="/v1/sessions/{session_id}/build-prompt"'

    def build_statuses(metrics: str) -> set[str]:
        return {
            line.split('status="')[1].split('"')[0]
            for line in metrics.splitlines()
            if line.startswith("contextd_http_request_duration_seconds_count{") and route in line
        }

    with run_server(settings) as server:
        with connect(server) as sock:
            head = request(
                "POST",
                "/v1/sessions/leaver/build-prompt",
                Authorization=f"Bearer {api_key}",
                Content_Type="application/json",
            )
            sock.sendall(head.replace(b"Content-Length: 0", b"Content-Length: 100") + b'{"qu')
        async with httpx.AsyncClient(base_url=server.url, timeout=DEADLINE) as http:

            async def statuses() -> set[str]:
                return build_statuses((await http.get("/metrics")).text)

            seen = await wait_for(
                statuses, lambda s: bool(s), timeout=DEADLINE, what="the request counted"
            )
            assert seen == {"499"}
            answer = await http.post(
                "/v1/sessions/leaver/build-prompt",
                json={"query": "还在吗? still there?"},
                headers={"Authorization": f"Bearer {api_key}"},
            )
            assert answer.status_code == 200
            assert await statuses() == {"200", "499"}


def test_a_complete_response_leaves_before_the_code_after_its_send_runs(
    settings: Settings,
) -> None:
    """What runs after a response's last send (here a background step that holds the event
    loop until the client has the answer) does not delay the answer: had the response waited
    for the next turn of the loop, the client would never get it while the loop is held."""
    app: FastAPI = create_app(settings)
    delivered = threading.Event()
    held_until_delivered: list[bool] = []

    async def hold_the_loop() -> None:
        held_until_delivered.append(delivered.wait(DEADLINE))

    @app.get("/then-hold")
    async def then_hold() -> Response:
        return Response(b"answered", background=BackgroundTask(hold_the_loop))

    with serve_app(app, settings) as server, connect(server) as sock:
        sock.sendall(request("GET", "/then-hold"))
        status, _, body = read_response(sock)
        delivered.set()
        assert (status, body) == (200, b"answered")
        sock.sendall(request("GET", "/healthz"))  # answered once the held step has finished
        assert read_response(sock)[0] == 200
    assert held_until_delivered == [True]


def test_an_unexpected_error_is_a_json_500_on_a_connection_that_stays_open(
    settings: Settings,
) -> None:
    app: FastAPI = create_app(settings)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    with serve_app(app, settings) as server, connect(server) as sock:
        sock.sendall(request("GET", "/boom"))
        status, _, body = read_response(sock)
        assert status == 500
        assert json.loads(body) == {
            "error": {"code": "internal_error", "message": "internal error"}
        }
        sock.sendall(request("GET", "/healthz"))
        assert read_response(sock)[0] == 200


def test_an_unreachable_database_is_a_503_with_retry_after(settings: Settings) -> None:
    # A fresh Settings: a copy would keep the cached SQLAlchemy URL of the real database.
    down = load_settings(
        database_url=closed_port_url().replace("http://", "postgresql://u@") + "/db",
        redis_url=settings.redis_url,
        embedding={"kind": "none"},
    )
    with run_server(down) as server, connect(server) as sock:
        for path in ("/v1/sessions/s", "/v1/sessions/s/turns"):
            sock.sendall(request("GET", path, Authorization="Bearer ctxd_anything"))
            status, headers, body = read_response(sock)
            assert status == 503
            assert headers["retry-after"] == str(settings.server.retry_after_seconds)
            assert json.loads(body)["error"]["code"] == "unavailable"
        sock.sendall(request("GET", "/readyz"))
        assert read_response(sock)[0] == 503
        sock.sendall(request("GET", "/healthz"))
        assert read_response(sock)[0] == 200


class RecordingTransport:
    def __init__(self) -> None:
        self.sends: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sends.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_a_response_written_in_parts_leaves_in_one_send() -> None:
    async def scenario() -> tuple[list[bytes], list[bytes], list[bytes], str]:
        loop = asyncio.get_running_loop()
        socket_side = RecordingTransport()
        transport = OneSendTransport(socket_side, loop)  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"")
        transport.write(b"body")
        before_turn_ends = list(socket_side.sends)
        turn_done = loop.create_future()
        loop.call_soon(turn_done.set_result, None)  # runs after the send scheduled first
        await turn_done
        after_turn = list(socket_side.sends)
        transport.write(b"last words")
        transport.close()  # sends what is pending before closing
        return before_turn_ends, after_turn, socket_side.sends, transport.get_extra_info("peer")

    before, after, at_close, info = asyncio.run(scenario())
    assert before == []
    assert after == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    assert at_close == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"last words"]
    assert info == "info:peer"
