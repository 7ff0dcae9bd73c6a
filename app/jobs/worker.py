"""The procrastinate app: durable jobs in Postgres, one lock per session, retries with backoff.

Each domain defines its tasks on a `Blueprint` in its own `tasks.py`; `create_job_app` gathers them.
Tasks receive the process's `AppContext` through the job context and reload state by id.
"""

import logging
from typing import Any

from procrastinate import App, Blueprint, JobContext, PsycopgConnector, RetryStrategy

from app.core.config import Settings
from app.core.context import AppContext
from app.jobs.queue import DEFAULT_QUEUE

logger = logging.getLogger("contextd.worker")

# Offload, embedding and notes jobs are idempotent, so retrying them is always safe.
DEFAULT_RETRY = RetryStrategy(max_attempts=8, exponential_wait=2)
STALLED_AFTER_SECONDS = 30.0

maintenance = Blueprint()


def app_context(job_context: JobContext) -> AppContext:
    return job_context.additional_context["app"]


@maintenance.periodic(cron="* * * * *", periodic_id="retry_stalled")
@maintenance.task(name="retry_stalled_jobs", queue=DEFAULT_QUEUE, pass_context=True)
async def retry_stalled_jobs(job_context: JobContext, timestamp: int) -> int:
    """Jobs whose worker died (SIGKILL, lost host) go back to the queue: tasks are idempotent."""
    assert job_context.app is not None
    manager = job_context.app.job_manager
    stalled = await manager.get_stalled_jobs(seconds_since_heartbeat=STALLED_AFTER_SECONDS)
    for job in stalled:
        assert job.id is not None
        logger.warning("retrying stalled job %s (%s)", job.id, job.task_name)
        await manager.retry_job(job)
    return len(stalled)


def plain_postgres_url(url: str) -> str:
    """psycopg wants `postgresql://`, not SQLAlchemy's `postgresql+psycopg://`."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def create_job_app(settings: Settings) -> App:
    assert settings.database_url
    app = App(connector=PsycopgConnector(conninfo=plain_postgres_url(settings.database_url)))
    app.add_tasks_from(maintenance, namespace="maintenance")
    return app


async def run_worker(settings: Settings, context: AppContext, **options: Any) -> None:
    """Run a worker until cancelled. Several workers (processes or hosts) may run side by side."""
    job_app = create_job_app(settings)
    async with job_app.open_async():
        await job_app.run_worker_async(
            queues=[DEFAULT_QUEUE],
            concurrency=options.pop("concurrency", 2),
            additional_context={"app": context},
            install_signal_handlers=options.pop("install_signal_handlers", False),
            update_heartbeat_interval=5.0,
            stalled_worker_timeout=STALLED_AFTER_SECONDS,
            delete_jobs="successful",
            **options,
        )
