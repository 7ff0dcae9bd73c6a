"""Operations endpoints: liveness, readiness and Prometheus metrics."""

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.http.deps import ContextDep
from app.store.jobs import queue_state

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="healthz", summary="Liveness: the process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    operation_id="readyz",
    summary="Readiness: database and cache reachable, worker and queue state",
    description=(
        "503 when Postgres is unreachable; Redis down only degrades (cache bypassed). `worker` "
        "counts live job runners (a heartbeat within CONTEXTD_WORKER__STALLED_AFTER_SECONDS: "
        "two per `contextd worker` process, one taking every job and one a session's offload, "
        "notes and erasure; one with CONTEXTD_WORKER__SESSION_SLOTS=0), jobs "
        "due and waiting (`oldest_pending_seconds`: since the oldest was due), running, stuck "
        "(running on a worker whose heartbeat stopped) and scheduled for later (a retry's "
        "backoff, the backup job of an erase done inline); with no live "
        "worker or stuck jobs its `ok` is false and `status` is `degraded` (still 200: the API "
        "serves, but offloads, notes and erasure wait)."
    ),
    responses={503: {"description": "not ready: the database cannot be reached"}},
)
async def readyz(context: ContextDep) -> JSONResponse:
    parts: dict[str, Any] = {}
    try:
        async with context.engine.connect() as conn:
            stalled = context.settings.worker.stalled_after_seconds
            pending, oldest, doing, stuck, live, scheduled = await queue_state(conn, stalled)
        parts["database"] = {"ok": True}
        parts["worker"] = {
            "ok": live > 0 and stuck == 0,
            "live_workers": int(live),
            "pending_jobs": int(pending),
            "oldest_pending_seconds": float(oldest),
            "running_jobs": int(doing),
            "stuck_jobs": int(stuck),
            "scheduled_jobs": int(scheduled),
        }
    except Exception as exc:  # any failure to reach Postgres means not ready
        parts["database"] = {"ok": False, "error": type(exc).__name__}
    parts["cache"] = {"ok": await context.cache.ping()}
    ready = parts["database"]["ok"]
    status = "ready" if parts.get("worker", {}).get("ok") else "degraded"
    return JSONResponse(
        status_code=200 if ready else 503,
        content={"status": status if ready else "unavailable", **parts},
    )


@router.get("/metrics", include_in_schema=False)
async def metrics(context: ContextDep) -> Response:
    """Prometheus text; no API key (it carries no tenant data)."""
    await context.metrics.refresh_queue(context.engine)
    return Response(context.metrics.render(), media_type=CONTENT_TYPE_LATEST)
