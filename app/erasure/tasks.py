"""Worker job of erasure: `memory:erase`, step two of a forget and of a session delete."""

import uuid

from procrastinate import Blueprint, JobContext

from app.erasure.erase import run_erase
from app.jobs.queue import DEFAULT_QUEUE, DEFAULT_RETRY, app_context


async def erase(job_context: JobContext, receipt_id: str) -> bool:
    context = app_context(job_context)
    return await run_erase(
        context.sessionmaker, context.settings, context.cache, context.http, uuid.UUID(receipt_id)
    )


def blueprint() -> Blueprint:
    """A fresh blueprint per job app (see `app.offload.tasks.blueprint`)."""
    tasks = Blueprint()
    tasks.task(name="erase", queue=DEFAULT_QUEUE, pass_context=True, retry=DEFAULT_RETRY)(erase)
    return tasks
