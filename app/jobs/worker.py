"""The procrastinate app: durable jobs in Postgres, one lock per session, retries with backoff.

Each domain defines its tasks on a `Blueprint` in its own `tasks.py`; `create_job_app` gathers them.
Tasks receive the process's `AppContext` through the job context and reload state by id.
"""

import asyncio
import contextlib
import logging

from procrastinate import App, PsycopgConnector

from app.core.config import Settings
from app.core.context import AppContext
from app.erasure.tasks import blueprint as erasure_tasks
from app.jobs.queue import DEFAULT_QUEUE
from app.memory.tasks import blueprint as memory_tasks
from app.notes.tasks import blueprint as notes_tasks
from app.offload.tasks import blueprint as offload_tasks

logger = logging.getLogger("contextd.worker")


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
    return app


async def retry_stalled_jobs(job_app: App, stalled_after_seconds: float) -> int:
    """Jobs whose worker died (SIGKILL, lost host) go back to the queue: tasks are idempotent."""
    manager = job_app.job_manager
    stalled = list(await manager.get_stalled_jobs(seconds_since_heartbeat=stalled_after_seconds))
    for job in stalled:
        logger.warning("retrying stalled job %s (%s)", job.id, job.task_name)
        await manager.retry_job(job)
    return len(stalled)


async def _watch_stalled(job_app: App, settings: Settings) -> None:
    while True:
        try:
            await retry_stalled_jobs(job_app, settings.worker.stalled_after_seconds)
        except Exception:  # the watcher must outlive a transient database error
            logger.exception("stalled-job check failed")
        await asyncio.sleep(settings.worker.maintenance_interval_seconds)


async def run_worker(settings: Settings, context: AppContext) -> None:
    """Run a worker until cancelled. Several workers (processes or hosts) may run side by side."""
    job_app = create_job_app(settings)
    await context.start_embedder()
    async with job_app.open_async():
        watcher = asyncio.create_task(_watch_stalled(job_app, settings))
        try:
            await job_app.run_worker_async(
                queues=[DEFAULT_QUEUE],
                concurrency=settings.worker.concurrency,
                additional_context={"app": context},
                install_signal_handlers=False,
                update_heartbeat_interval=settings.worker.heartbeat_seconds,
                stalled_worker_timeout=settings.worker.stalled_after_seconds,
                delete_jobs="successful",
            )
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
