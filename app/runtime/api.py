"""The FastAPI application factory."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from fastapi import FastAPI
from starlette.routing import NoMatchFound

from app import __version__
from app.agent.endpoints import router as agent_router
from app.agent.mcp import McpEndpoint
from app.core.config import Settings, load_settings
from app.core.context import AppContext
from app.core.cpu import one_blas_thread
from app.core.observability import Metrics, RequestContextMiddleware
from app.domain.tokens import encoding
from app.erasure.endpoints import router as erasure_router
from app.http import health
from app.http.direct import DirectRoutes
from app.http.errors import install_error_handlers
from app.http.server import HostAllowList, RequestBodyGuard, SlashInSessionId, settled_heap
from app.inspect.endpoints import router as inspect_router
from app.inspect.security import InspectorHeaders
from app.memories.endpoints import router as memories_router
from app.notes.endpoints import router as notes_router
from app.offload.endpoints import router as offload_router
from app.prompt.endpoints import DIRECT_ROUTES
from app.prompt.endpoints import router as prompt_router
from app.sessions.endpoints import router as sessions_router

DESCRIPTION = """Context-as-a-service for LLM agents: append turns, build prompts that fit the
window, recall offloaded history. Authenticate with `Authorization: Bearer <key>`."""


def create_app(settings: Settings | None = None, metrics: Metrics | None = None) -> FastAPI:
    """`metrics`: share one registry with a worker running in this process."""
    settings = settings or load_settings()
    mcp = McpEndpoint(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        encoding()  # load the tokenizer before the first request, not during it
        one_blas_thread()
        context = AppContext.create(settings, metrics)
        await context.start_embedder(warm=("query",))  # embedded on the request path
        app.state.context = context
        try:
            with settled_heap():
                async with mcp.running():
                    yield
        finally:
            await context.aclose()

    app = FastAPI(
        title="contextd",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    install_error_handlers(app, settings.server.retry_after_seconds)
    app.add_middleware(DirectRoutes, routes=DIRECT_ROUTES)  # innermost: inside the body guard
    app.add_middleware(
        RequestBodyGuard,
        max_bytes=settings.limits.max_body_bytes,
        timeout=settings.server.body_timeout_seconds,
    )
    app.add_middleware(SlashInSessionId)  # before the router splits the id at its "/"
    app.add_middleware(HostAllowList, allowed=settings.allowed_hosts)  # before any route runs
    app.add_middleware(InspectorHeaders)  # on every inspector answer, refusals too
    app.add_middleware(RequestContextMiddleware)  # outermost: every answer gets its request id
    app.include_router(health.router)
    app.include_router(sessions_router)
    app.include_router(offload_router)
    app.include_router(notes_router)
    app.include_router(agent_router)
    app.include_router(memories_router)
    app.include_router(erasure_router)
    app.include_router(prompt_router)
    app.include_router(inspect_router)
    app.router.routes.append(mcp.route())
    build_routes(app)
    return app


def build_routes(app: FastAPI) -> None:
    """Build every route's validators now, not on the event loop. FastAPI (0.16x) builds an
    included router's routes when the first request reaches them: ~0.1 s of pydantic schema work
    on an idle machine, several times that under load, stalling every request meanwhile. Asking
    for a URL no route is named for walks every route, so builds them all."""
    with suppress(NoMatchFound):
        app.url_path_for("contextd: build every route")
