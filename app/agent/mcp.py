"""The MCP endpoint at `/mcp`: streamable HTTP from the official SDK, stateless (no MCP session
to pin a client to one process), authenticated with the same API keys and tenants as the REST API.
"""

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from inspect import isawaitable
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import (
    StreamableHTTPASGIApp,
    StreamableHTTPSessionManager,
)
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from app import __version__
from app.agent import mcp_tools as tools
from app.auth.deps import get_caller
from app.core.config import Settings
from app.core.context import AppContext
from app.core.db import unit_of_work
from app.core.errors import ContextdError, InternalError
from app.domain.callers import Caller

logger = logging.getLogger("contextd.mcp")

PATH = "/mcp"


def browser_origins(settings: Settings) -> TransportSecuritySettings | None:
    """Without keys, the SDK's check that a browser's `Origin` is one of the allowed hosts (the
    Host header itself is checked for every path by `app.http.server.HostAllowList`)."""
    if not settings.auth_disabled:
        return None
    names = settings.allowed_hosts
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[host for name in names for host in (name, f"{name}:*")],
        allowed_origins=[
            origin
            for name in names
            for scheme in ("http", "https")
            for origin in (f"{scheme}://{name}", f"{scheme}://{name}:*")
        ],
    )


class NamedRoute(Route):
    """A route that puts itself in the request's scope, as FastAPI's own routes do: the access
    log and the request metrics then name its path (`app.core.observability`), not
    "unmatched"."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self
        return match, child_scope


def refusal(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """A request refused before any tool ran (no key, a wrong key, over the rate limit), as a
    JSON-RPC error: MCP clients show its message ("401 unauthorized: invalid or revoked API
    key") where a bare HTTP status becomes "internal error". `data` is the REST error body."""
    error = body["error"]
    code = types.INTERNAL_ERROR if status >= 500 else types.INVALID_REQUEST
    return {
        "jsonrpc": "2.0",
        "id": None,  # not read: the request is refused before its body
        "error": {
            "code": code,
            "message": f"{status} {error['code']}: {error['message']}",
            "data": {"status": status, **body},
        },
    }


def _context(ctx: ServerRequestContext[Any, Any]) -> tuple[AppContext, Caller]:
    request = ctx.request
    assert isinstance(request, Request)  # streamable HTTP hands every handler its request
    return request.app.state.context, request.state.caller


async def _list_tools(
    ctx: ServerRequestContext[Any, Any], _: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    context, caller = _context(ctx)
    try:
        async with unit_of_work(context.sessionmaker) as db:
            return types.ListToolsResult(tools=await tools.list_tools(db, context, caller))
    except Exception as exc:
        status, body = await _as_rest_error(ctx, exc)
        error = refusal(status, body)["error"]
        raise MCPError(error["code"], error["message"], error["data"]) from None


async def _call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    context, caller = _context(ctx)
    try:
        async with unit_of_work(context.sessionmaker) as db:
            answer = await tools.call_tool(db, context, caller, params.name, params.arguments or {})
    except Exception as exc:  # rolled back: nothing half-written
        _, body = await _as_rest_error(ctx, exc)
        return tools.error_result(body)
    return tools.tool_result(answer)


async def _as_rest_error(
    ctx: ServerRequestContext[Any, Any], exc: Exception
) -> tuple[int, dict[str, Any]]:
    """The status and error body the REST API answers `exc` with: its own exception handler
    (`app.core.errors`), else the 500 of `RequestContextMiddleware`. Never the exception's own
    text, which may quote SQL and its parameters."""
    request = ctx.request
    assert isinstance(request, Request)
    if isinstance(exc, ContextdError):
        return exc.status_code, exc.body()
    handler = next(
        (
            request.app.exception_handlers[kind]
            for kind in type(exc).__mro__
            if kind in request.app.exception_handlers and kind is not Exception
        ),
        None,
    )
    answer = handler(request, exc) if handler is not None else None
    if isawaitable(answer):
        answer = await answer
    if isinstance(answer, JSONResponse):
        return answer.status_code, json.loads(bytes(answer.body))
    logger.error("unhandled error in an MCP tool call", exc_info=exc)
    return InternalError.status_code, InternalError("internal error").body()


class McpEndpoint:
    """ASGI app of `/mcp`: resolves the caller from `Authorization: Bearer` (or the dev caller
    when auth is disabled) exactly as the REST API does, then hands over to the SDK."""

    def __init__(self, settings: Settings) -> None:
        server: Server[Any] = Server(
            "contextd",
            version=__version__,
            instructions="contextd: conversation memory. Use `memory` to search a session's "
            "earlier history or keep a point; `build_prompt` for a window-sized prompt.",
            on_list_tools=_list_tools,
            on_call_tool=_call_tool,
        )
        self.manager = StreamableHTTPSessionManager(
            app=server,
            stateless=True,
            json_response=True,
            security_settings=browser_origins(settings),
        )
        self._app = StreamableHTTPASGIApp(self.manager)

    def route(self) -> NamedRoute:
        return NamedRoute(PATH, endpoint=self, methods=["GET", "POST", "DELETE"])

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        context: AppContext = request.app.state.context
        try:
            async with unit_of_work(context.sessionmaker) as db:
                caller = await get_caller(request, db, context, None)
        except ContextdError as exc:
            headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
            answer = JSONResponse(refusal(exc.status_code, exc.body()), exc.status_code, headers)
            await answer(scope, receive, send)
            return
        scope.setdefault("state", {})["caller"] = caller
        await self._app(scope, receive, send)
