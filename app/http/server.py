"""HTTP hardening around the application: time and size limits a slow or hostile client hits.

- A request's head (request line and headers) must arrive within `header_timeout_seconds` of the
  connection opening or of the previous response, else the connection is closed
  (`guarded_h11_protocol`, uvicorn's h11 protocol with one more timer; uvicorn itself only times
  out idle keep-alive connections, and any byte, even of a half-sent head, stops that timer).
- A response leaves in one send (`OneSendTransport`): uvicorn writes a response's head and body
  separately, two system calls on the socket and two wake-ups of the client where one does. It
  leaves as soon as it is complete, before the application's code after the send runs.
- A request body must arrive whole within `body_timeout_seconds` of the head (408) and stay
  within `limits.max_body_bytes` (413, refused from `Content-Length` before reading when it says
  so) — `RequestBodyGuard`, pure ASGI, raising `BodyError` where the application reads the body,
  so the error handlers answer it. A 408 closes the connection; after a 413 the server reads
  and discards the rest of the body (clients send a whole body before they read an answer),
  also when the connection closes after the answer (`OneSendTransport.close`).
- A request's Host header must name an allowed host, any port (`HostAllowList`,
  `allowed_hosts`): a web page whose name an attacker rebinds to 127.0.0.1 would otherwise read
  and erase a keyless `contextd dev` from the developer's browser (DNS rebinding). Else 421.
- The cyclic garbage collector leaves the startup objects alone (`settled_heap`).
"""

import asyncio
import gc
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.core.config import ANY_HOST, Settings
from app.core.errors import InvalidSessionId, MisdirectedRequest, PayloadTooLarge, RequestTimeout
from app.http.errors import BodyError


class OneSendTransport:
    """A socket transport whose writes made in one turn of the event loop go out together, in
    one send at the start of the next turn (a response's head, body and end are written in one
    turn), or at `flush`. Everything but writing and closing is the socket transport's own;
    closing sends what is pending first (and lingers while `peer_sending`), aborting drops it."""

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        peer_sending: Callable[[], bool] = lambda: False,
    ) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._peer_sending = peer_sending
        self.lingering = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self._send)
        self._pending.append(data)

    def flush(self) -> None:
        """Send what is pending now (a response is complete: nothing more joins it)."""
        self._send()

    def _send(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._send()
        if self.lingering or not self._peer_sending():
            self._transport.close()
            return
        # The client still sends a body nobody will read (refused by a 413, given up by a 408)
        # and the connection ends with this answer. Closing with its bytes unread makes the
        # kernel send a reset, which destroys the answer before a client that sends its whole
        # body first (urllib, any HTTP/1.0 client) reads it. So only the sending side closes:
        # the answer and a FIN go out, the rest of the body is read and dropped until the
        # client closes (or `close_now`, on the head timer).
        self.lingering = True
        self._transport.write_eof()
        self._transport.resume_reading()  # uvicorn pauses reading past 64 KiB of unread body

    def close_now(self) -> None:
        self._send()
        self._transport.close()

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_h11_protocol(header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request head is not complete in time,
    and sending each response in one write (`OneSendTransport`)."""

    class GuardedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _one_send: OneSendTransport

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # After uvicorn read the peer's address and built its flow control from the socket's.
            self._one_send = OneSendTransport(transport, self.loop, self._peer_sends_a_body)
            self.transport = self._one_send  # type: ignore[assignment]
            self._watch_head()

        def _peer_sends_a_body(self) -> bool:
            return self.conn.their_state is h11.SEND_BODY

        def data_received(self, data: bytes) -> None:
            if self._one_send.lingering:
                return  # the rest of a body after the last answer: dropped
            super().data_received(data)
            self._watch_head()

        def on_response_complete(self) -> None:
            # Called by the response's last send: the client gets it before the rest of the
            # application's task (middleware bookkeeping, work deferred past the response) runs.
            self._one_send.flush()
            super().on_response_complete()
            self._watch_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def _watch_head(self) -> None:
            """Timer on while no request is being served (the peer owes a complete head, or
            sends the rest of a body nobody reads), off while the application has a request."""
            if self.cycle is None or self.cycle.response_complete:
                if self._head_timer is None:
                    self._head_timer = self.loop.call_later(header_timeout, self._head_timed_out)
            else:
                self._stop_head_timer()

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            self._one_send.close_now()

    return GuardedH11Protocol


def body_too_large(limit: int) -> BodyError:
    """The server discards the rest of the body after answering (the client, which sends its
    whole body before reading, gets the answer), within the head timeout."""
    return BodyError(PayloadTooLarge(f"the request body exceeds {limit} bytes"))


class RequestBodyGuard:
    """Pure ASGI: the body within `max_bytes` and received whole within `timeout` seconds."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        received = 0
        complete = False

        async def guarded_receive() -> Message:
            nonlocal received, complete
            if complete:  # only the disconnect notice is left to wait for: no deadline
                return await receive()
            if declared is not None and declared > self.max_bytes:
                raise body_too_large(self.max_bytes)  # before reading a byte of it
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyError(
                    RequestTimeout(
                        f"the request body did not arrive within {self.timeout:g} s",
                        headers={"Connection": "close"},
                    )
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > self.max_bytes:
                    raise body_too_large(self.max_bytes)
            return message

        await self.app(scope, guarded_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


# Container objects allocated (net) before the collector looks at the young ones: more than one
# build holds at once. At CPython's 700 a no-recall build of 50 turns sat at the edge: a little
# more alive at once and every second build ran a collection, whose survivors fed full ones.
YOUNG_GENERATION_OBJECTS = 20_000


@contextmanager
def settled_heap() -> Iterator[None]:
    """While serving: the objects made at startup (~235,000: modules, schemas, SQLAlchemy's
    tables, the tokenizer) frozen out of the cyclic collector's reach, and a young generation
    larger than a request's objects. A full collection walked all of them, ~0.4 s on a busy
    machine, every few dozen builds (a no-recall build's median is ~2 ms). Garbage
    cycles are still collected: the frozen objects are the ones alive at startup."""
    gc.collect()
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_OBJECTS, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def uvicorn_config(app: ASGIApp, settings: Settings) -> uvicorn.Config:
    """The uvicorn configuration of the API: our logging, and the connection timeouts."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,  # keep our handlers (JSON); our middleware writes the access log
        access_log=False,
        http=guarded_h11_protocol(settings.server.header_timeout_seconds),
        timeout_keep_alive=settings.server.keep_alive_seconds,
    )


def host_name(host: str) -> str:
    """The name of a Host header value, without its port, lower case: `[::1]:8080` → `[::1]`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    name, _, port = host.rpartition(":")
    return name if name and port.isdigit() else host


class HostAllowList:
    """Pure ASGI: answers a request whose Host header is missing or names a host not in
    `allowed` with a 421 (the API, MCP and the inspector alike). Health probes and metrics pass:
    an orchestrator probes and Prometheus scrapes the container by its IP or service name, and
    they tell nothing of a tenant."""

    OPEN_PATHS = ("/healthz", "/readyz", "/metrics")

    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app = app
        self.allowed = frozenset(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or ANY_HOST in self.allowed:  # the API serves no websocket
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        if host_name(host) in self.allowed or scope["path"] in self.OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        shown = host[:64] or "(none)"
        refused = MisdirectedRequest(
            f"this server does not answer for Host {shown!r} (allowed: "
            f"{', '.join(sorted(self.allowed))}; see CONTEXTD_ALLOWED_HOSTS)",
            field="Host",
        )
        await refused.response()(scope, receive, send)


# A session segment of a path (the API's, the inspector's) holding an encoded "/".
_SLASH_IN_SESSION_SEGMENT = re.compile(rb"/sessions/[^/?]*%2f", re.IGNORECASE)


class SlashInSessionId:
    """Pure ASGI: a session id holding "/", sent as one percent-encoded path segment (`a%2Fb`,
    as the clients send every id), is refused as every id outside the session-id rule is (422
    `invalid_session_id`). The router matches the decoded path, where that "/" splits the id:
    it was a route 404, or another route (`x%2Fturns` read session `x`'s turns)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path: bytes = (scope.get("raw_path") or b"").partition(b"?")[0]
        if scope["type"] == "http" and _SLASH_IN_SESSION_SEGMENT.search(raw_path):
            refused = InvalidSessionId(InvalidSessionId.RULE, field="session_id")
            await refused.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)
