"""Operations endpoints: liveness, readiness and Prometheus metrics."""

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from app.http.deps import ContextDep

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="healthz", summary="Liveness: the process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


# The job queue as readiness sees it: jobs waiting, running, and running on a worker whose
# heartbeat stopped (its process died; the stalled-job watcher of a live worker retries them).
_QUEUE = text(
    """
    WITH live AS (
        SELECT id FROM procrastinate_workers
        WHERE last_heartbeat > now() - make_interval(secs => :stalled)
    )
    SELECT
        count(*) FILTER (WHERE j.status = 'todo'),
        coalesce(extract(epoch FROM now() - min(e.at) FILTER (WHERE j.status = 'todo')), 0),
        count(*) FILTER (WHERE j.status = 'doing'),
        count(*) FILTER (
            WHERE j.status = 'doing'
            AND (j.worker_id IS NULL OR j.worker_id NOT IN (SELECT id FROM live))
        ),
        (SELECT count(*) FROM live)
    FROM procrastinate_jobs j
    LEFT JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'deferred'
    WHERE j.status IN ('todo', 'doing')
    """
)


@router.get(
    "/readyz",
    operation_id="readyz",
    summary="Readiness: database and cache reachable, worker and queue state",
    description=(
        "503 when Postgres is unreachable; Redis down only degrades (cache bypassed). `worker` "
        "counts live workers (a heartbeat within CONTEXTD_WORKER__STALLED_AFTER_SECONDS), jobs "
        "waiting, running and stuck (running on a worker whose heartbeat stopped); with no live "
        "worker or stuck jobs its `ok` is false and `status` is `degraded` (still 200: the API "
        "serves, but offloads, notes and erasure wait)."
    ),
    responses={503: {"description": "not ready: the database cannot be reached"}},
)
async def readyz(context: ContextDep) -> JSONResponse:
    parts: dict[str, Any] = {}
    try:
        async with context.engine.connect() as conn:
            queue = await conn.execute(
                _QUEUE, {"stalled": context.settings.worker.stalled_after_seconds}
            )
            pending, oldest, doing, stuck, live = queue.one()
        parts["database"] = {"ok": True}
        parts["worker"] = {
            "ok": live > 0 and stuck == 0,
            "live_workers": int(live),
            "pending_jobs": int(pending),
            "oldest_pending_seconds": float(oldest),
            "running_jobs": int(doing),
            "stuck_jobs": int(stuck),
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
