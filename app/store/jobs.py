"""SQL over procrastinate's tables (their schema is procrastinate's, not ours): the defer
function that inserts a job, and the reads of `procrastinate_jobs`, `_events` and `_workers` that
the enqueue, the sweep and readiness make. The lock names are `app.jobs.queue`'s, passed in."""

from typing import Any

from sqlalchemy import column, table, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

# procrastinate's job table: what the sweep checks.
JOBS = table("procrastinate_jobs", column("queueing_lock"), column("status"))

_DEFER = text(
    "SELECT unnest(procrastinate_defer_jobs_v1(ARRAY[ROW("
    ":queue, :task, :priority, :lock, :queueing_lock, CAST(:args AS jsonb), :scheduled_at"
    ")]::procrastinate_job_to_defer_v1[]))"
)


async def defer_job(db: AsyncSession, params: dict[str, Any]) -> None:
    """Insert one job in a savepoint of the current transaction. A pending job with the same
    `queueing_lock` raises `IntegrityError`: the savepoint is rolled back, the transaction is
    not."""
    async with db.begin_nested():
        await db.execute(_DEFER, params)


async def waiting_under(db: AsyncSession, lock: str) -> int:
    """Jobs waiting (not yet running) under one lock."""
    result = await db.execute(
        text("SELECT count(*) FROM procrastinate_jobs WHERE lock = :lock AND status = 'todo'"),
        {"lock": lock},
    )
    return int(result.scalar_one())


async def pending_under(db: AsyncSession, session: str, embeddings: str) -> int:
    """Jobs waiting or running under either of a session's two locks."""
    result = await db.execute(
        text(
            "SELECT count(*) FROM procrastinate_jobs WHERE lock IN (:session, :embeddings) "
            "AND status IN ('todo', 'doing')"
        ),
        {"session": session, "embeddings": embeddings},
    )
    return int(result.scalar_one())


# The job queue as readiness sees it: jobs due and waiting (and how long since they were due),
# running, running on a worker whose heartbeat stopped (its process died; the stalled-job
# watcher of a live worker retries them), and queued for later (a retry's backoff, the backup
# job of an erase done inline): those are not waiting for a worker yet.
_QUEUE = text(
    """
    WITH live AS (
        SELECT id FROM procrastinate_workers
        WHERE last_heartbeat > now() - make_interval(secs => :stalled)
    ), queued AS (
        SELECT j.status, j.worker_id,
            j.status = 'todo' AND coalesce(j.scheduled_at <= now(), true) AS due,
            greatest(e.at, j.scheduled_at) AS due_since
        FROM procrastinate_jobs j
        LEFT JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'deferred'
        WHERE j.status IN ('todo', 'doing')
    )
    SELECT
        count(*) FILTER (WHERE due),
        coalesce(extract(epoch FROM now() - min(due_since) FILTER (WHERE due)), 0),
        count(*) FILTER (WHERE status = 'doing'),
        count(*) FILTER (
            WHERE status = 'doing'
            AND (worker_id IS NULL OR worker_id NOT IN (SELECT id FROM live))
        ),
        (SELECT count(*) FROM live),
        count(*) FILTER (WHERE status = 'todo' AND NOT due)
    FROM queued
    """
)


async def queue_state(conn: AsyncConnection, stalled_after_seconds: float) -> tuple[Any, ...]:
    """One row: jobs due and waiting, seconds the oldest has waited since due, jobs running, jobs
    stuck (running on a worker whose heartbeat is older than `stalled_after_seconds`), live
    workers, jobs queued for later."""
    queue = await conn.execute(_QUEUE, {"stalled": stalled_after_seconds})
    return tuple(queue.one())
