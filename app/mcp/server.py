"""The MCP endpoint at `/mcp`: streamable HTTP from the official SDK, stateless (no MCP session
to pin a client to one process), authenticated with the same API keys and tenants as the REST API.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import (
    StreamableHTTPASGIApp,
    StreamableHTTPSessionManager,
)
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app import __version__
from app.auth.deps import get_caller
from app.auth.schemas import Caller
from app.core.config import Settings
from app.core.context import AppContext
from app.core.db import unit_of_work
from app.core.errors import ContextdError
from app.mcp import tools

PATH = "/mcp"
LOOPBACK = TransportSecuritySettings(
    enable_dns_rebinding_protection=True,
    allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
    allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
)


def _context(ctx: ServerRequestContext[Any, Any]) -> tuple[AppContext, Caller]:
    request = ctx.request
    assert isinstance(request, Request)  # streamable HTTP hands every handler its request
    return request.app.state.context, request.state.caller


async def _list_tools(
    ctx: ServerRequestContext[Any, Any], _: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    context, caller = _context(ctx)
    async with unit_of_work(context.sessionmaker) as db:
        return types.ListToolsResult(tools=await tools.list_tools(db, context, caller))


async def _call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    context, caller = _context(ctx)
    try:
        async with unit_of_work(context.sessionmaker) as db:
            answer = await tools.call_tool(db, context, caller, params.name, params.arguments or {})
    except ContextdError as exc:  # rolled back: nothing half-written
        return tools.error_result(exc)
    return tools.tool_result(answer)


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
            # without keys, only pages on loopback may reach it (DNS-rebinding protection)
            security_settings=LOOPBACK if settings.auth_disabled else None,
        )
        self._app = StreamableHTTPASGIApp(self.manager)

    def route(self) -> Route:
        return Route(PATH, endpoint=self, methods=["GET", "POST", "DELETE"])

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
            await JSONResponse(exc.body(), exc.status_code, headers=headers)(scope, receive, send)
            return
        scope.setdefault("state", {})["caller"] = caller
        await self._app(scope, receive, send)
