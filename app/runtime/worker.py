"""The procrastinate app: durable jobs in Postgres, one lock per session, retries with backoff.

Each domain defines its tasks on a `Blueprint` in its own `tasks.py`; `create_job_app` gathers them.
Tasks receive the process's `AppContext` through the job context and reload state by id.
"""

import asyncio
import contextlib
import logging

from procrastinate import App, PsycopgConnector
from procrastinate.exceptions import UniqueViolation
from procrastinate.jobs import Status

from app.core.config import Settings
from app.core.context import AppContext
from app.erasure.tasks import blueprint as erasure_tasks
from app.jobs.queue import BACKGROUND_QUEUE, DEFAULT_QUEUE
from app.memories.tasks import blueprint as memory_tasks
from app.notes.tasks import blueprint as notes_tasks
from app.offload.tasks import blueprint as offload_tasks
from app.sessions.tasks import blueprint as session_tasks

logger = logging.getLogger("contextd.worker")
# Waits before starting again after the worker stopped: doubling from the first to the second.
RESTART_MIN_SECONDS, RESTART_MAX_SECONDS = 0.5, 15.0


def plain_postgres_url(url: str) -> str:
    """psycopg wants `postgresql://`, not SQLAlchemy's `postgresql+psycopg://`."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def create_job_app(settings: Settings) -> App:
    assert settings.database_url
    app = App(connector=PsycopgConnector(conninfo=plain_postgres_url(settings.database_url)))
    app.add_tasks_from(offload_tasks(), namespace="offload")
    app.add_tasks_from(notes_tasks(), namespace="notes")
    app.add_tasks_from(erasure_tasks(), namespace="memory")  # task name `memory:erase`
    app.add_tasks_from(memory_tasks(), namespace="memory")  # `memory:embed`, the sweep
    app.add_tasks_from(session_tasks(), namespace="sessions")  # the idempotency records' purge
    return app


async def retry_stalled_jobs(job_app: App, stalled_after_seconds: float) -> int:
    """Jobs whose worker died (SIGKILL, lost host) go back to the queue: tasks are idempotent.

    A stalled job whose queueing lock a queued twin has taken meanwhile (the sweeper enqueued the
    same work) cannot go back: it is marked failed, and the twin does the work."""
    manager = job_app.job_manager
    stalled = list(await manager.get_stalled_jobs(seconds_since_heartbeat=stalled_after_seconds))
    for job in stalled:
        logger.warning("retrying stalled job %s (%s)", job.id, job.task_name)
        try:
            await manager.retry_job(job)
        except UniqueViolation:
            logger.warning("stalled job %s has a queued twin; marked failed", job.id)
            await manager.finish_job(job, Status.FAILED, delete_job=False)
    return len(stalled)


async def _watch_stalled(job_app: App, settings: Settings, stop: asyncio.Event) -> None:
    """Retry stalled jobs every maintenance interval until `stop` is set. The event, not only a
    cancel, ends it: psycopg's pool can swallow a cancel that lands while it waits for a
    connection (seen after a PostgreSQL restart), and the watcher then ran on for ~45 s."""
    while not stop.is_set():
        try:
            await retry_stalled_jobs(job_app, settings.worker.stalled_after_seconds)
        except Exception:  # the watcher must outlive a transient database error
            logger.exception("stalled-job check failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.worker.maintenance_interval_seconds)


async def run_worker(settings: Settings, context: AppContext) -> None:
    """Run a worker until cancelled. Several workers (processes or hosts) may run side by side.

    The worker outlives its database: when PostgreSQL restarts, procrastinate loses its
    connections and stops (or raises); the worker then starts again on fresh connections, with a
    backoff while PostgreSQL refuses them. Jobs it was running when the connection died are
    retried as stalled once its old heartbeat is stale."""
    await context.start_embedder(warm=("passage",))
    loop = asyncio.get_running_loop()
    delay = RESTART_MIN_SECONDS
    while True:
        started = loop.time()
        try:
            await _run_until_stopped(settings, context)
            logger.warning("worker stopped (its database connection was lost); restarting")
        except Exception as exc:
            logger.warning("worker failed (%s); restarting", type(exc).__name__)
        if loop.time() - started > RESTART_MAX_SECONDS:
            delay = RESTART_MIN_SECONDS  # it ran well for a while: not a restart loop
        await asyncio.sleep(delay)  # backoff while PostgreSQL refuses connections
        delay = min(delay * 2, RESTART_MAX_SECONDS)


async def _run_until_stopped(settings: Settings, context: AppContext) -> None:
    job_app = create_job_app(settings)
    async with job_app.open_async():
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch_stalled(job_app, settings, stop))
        # Two procrastinate workers share the process: one takes every job (a session's first,
        # `app.jobs.queue.PRIORITY`), the other only a session's offload, notes and erasure, so
        # these have slots that no embedding batch or index build holds (`worker.session_slots`).
        slots = {"worker": ([DEFAULT_QUEUE, BACKGROUND_QUEUE], settings.worker.concurrency)}
        if settings.worker.session_slots:
            slots["session-worker"] = ([DEFAULT_QUEUE], settings.worker.session_slots)
        workers = [
            asyncio.create_task(
                job_app.run_worker_async(
                    name=name,
                    queues=queues,
                    concurrency=concurrency,
                    additional_context={"app": context},
                    install_signal_handlers=False,
                    update_heartbeat_interval=settings.worker.heartbeat_seconds,
                    # A job queued behind a session's lock is announced while the lock is held
                    # and the announcement is spent on a failed fetch; nothing wakes the worker
                    # when the lock is released, so only this poll takes it (procrastinate's
                    # default: 5 s).
                    fetch_job_polling_interval=settings.worker.poll_seconds,
                    stalled_worker_timeout=settings.worker.stalled_after_seconds,
                    delete_jobs="successful",
                )
            )
            for name, (queues, concurrency) in slots.items()
        ]
        try:
            # One stops (its database connection was lost) or fails: both start again.
            done, _ = await asyncio.wait(workers, return_when=asyncio.FIRST_COMPLETED)
            for finished in done:
                finished.result()
        finally:
            for worker in workers:
                worker.cancel()  # a graceful stop: running jobs end first
            await asyncio.gather(*workers, return_exceptions=True)
            stop.set()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
