"""A direct path to the hottest endpoint, past FastAPI's per-request machinery.

FastAPI answers a request by walking the router, solving the endpoint's dependencies one by one
(caller, scope, database session, context, path parameter, body) and validating and encoding the
response model: on a build-prompt without recall that was a third of the server's CPU. A
`DirectRoute` names a declared `APIRoute` (its path, OpenAPI schema and error answers stay what
the declaration says) and a handler that does the same work in one plain function. The handler
gets the request and its body; it answers, or returns None to hand the request to the full
stack unchanged (the body is replayed), which is what it does for anything unusual, so that every
refusal (a body that does not validate, a malformed id) keeps FastAPI's exact answer.

An exception the handler raises is answered by the application's exception handlers, as the
full stack would answer it; one no handler takes propagates to `RequestContextMiddleware` (500).
What the handler defers with `observability.after_response` (the build's log line and metrics)
runs once its answer is sent.
"""

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.observability import deferred_until_sent

DirectHandler = Callable[[Request, bytes], Awaitable[Response | None]]


@dataclass(frozen=True)
class DirectRoute:
    route: APIRoute  # the declaration: path template, methods, OpenAPI
    handler: DirectHandler


class DirectRoutes:
    """Pure ASGI, inside the body guard: requests matching a `DirectRoute` go to its handler."""

    def __init__(self, app: ASGIApp, routes: Sequence[DirectRoute]) -> None:
        self.app = app
        self.routes = tuple(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for direct in self.routes:
                match, child_scope = direct.route.matches(scope)
                if match is Match.FULL:
                    scope.update(child_scope)
                    await self._handle(direct, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _handle(
        self, direct: DirectRoute, scope: Scope, receive: Receive, send: Send
    ) -> None:
        with deferred_until_sent():
            request = Request(scope, receive)
            try:
                body = await request.body()
                response = await direct.handler(request, body)
            except Exception as exc:
                response = await _handled(request, exc)
            if response is None:
                await self.app(scope, _replay(body, receive), send)
                return
            await response(scope, receive, send)


async def _handled(request: Request, exc: Exception) -> Response:
    """The application's answer to `exc` (its exception handlers, most specific class first)."""
    app: FastAPI = request.app
    for kind in type(exc).__mro__:
        handler = app.exception_handlers.get(kind)
        if handler is not None:
            response = handler(request, exc)
            return await response if isinstance(response, Awaitable) else response
    raise exc


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for the full stack after the body was read here: the body once, then the
    client's own messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
