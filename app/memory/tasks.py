"""Worker job of the memory tool: `memory:erase`, step two of forget and of a session delete."""

import uuid

from procrastinate import Blueprint, JobContext

from app.jobs.queue import DEFAULT_QUEUE
from app.jobs.worker import DEFAULT_RETRY, app_context
from app.memory.erase import run_erase


async def erase(job_context: JobContext, receipt_id: str) -> bool:
    context = app_context(job_context)
    return await run_erase(
        context.sessionmaker, context.settings, context.cache, uuid.UUID(receipt_id)
    )


def blueprint() -> Blueprint:
    """A fresh blueprint per job app (see `app.offload.tasks.blueprint`)."""
    tasks = Blueprint()
    tasks.task(name="erase", queue=DEFAULT_QUEUE, pass_context=True, retry=DEFAULT_RETRY)(erase)
    return tasks
