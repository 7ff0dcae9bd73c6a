"""Operations endpoints: liveness, readiness and Prometheus metrics."""

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from app.core.deps import ContextDep

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="healthz", summary="Liveness: the process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    operation_id="readyz",
    summary="Readiness: database and cache reachable, worker lag",
    description="503 when Postgres is unreachable; Redis down only degrades (cache bypassed).",
)
async def readyz(context: ContextDep) -> JSONResponse:
    parts: dict[str, Any] = {}
    try:
        async with context.engine.connect() as conn:
            lag = await conn.execute(
                text(
                    "SELECT count(*), coalesce(extract(epoch FROM now() - min(e.at)), 0) "
                    "FROM procrastinate_jobs j JOIN procrastinate_events e "
                    "ON e.job_id = j.id AND e.type = 'deferred' WHERE j.status = 'todo'"
                )
            )
            pending, oldest = lag.one()
        parts["database"] = {"ok": True}
        parts["worker"] = {"pending_jobs": int(pending), "oldest_pending_seconds": float(oldest)}
    except Exception as exc:  # any failure to reach Postgres means not ready
        parts["database"] = {"ok": False, "error": type(exc).__name__}
    parts["cache"] = {"ok": await context.cache.ping()}
    ready = parts["database"]["ok"]
    return JSONResponse(
        status_code=200 if ready else 503,
        content={"status": "ready" if ready else "unavailable", **parts},
    )


@router.get("/metrics", include_in_schema=False)
async def metrics(context: ContextDep) -> Response:
    """Prometheus text; no API key (it carries no tenant data)."""
    await context.metrics.refresh_queue(context.engine)
    return Response(context.metrics.render(), media_type=CONTENT_TYPE_LATEST)
