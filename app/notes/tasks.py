"""Worker job of the notes (C2): refresh after an offload (every Nth version, and on request, a
rebuild from the raw turns: `app.notes.service.compute_notes`)."""

import uuid

from procrastinate import Blueprint, JobContext

from app.core.db import unit_of_work
from app.jobs.queue import DEFAULT_QUEUE, DEFAULT_RETRY, app_context
from app.notes.service import refresh_notes


async def refresh(job_context: JobContext, session_pk: str, rebuild: bool = False) -> bool:
    context = app_context(job_context)
    async with unit_of_work(context.sessionmaker) as db:
        outcome = await refresh_notes(
            db,
            context.settings,
            context.cache,
            uuid.UUID(session_pk),
            rebuild=rebuild,
            llm_client=context.http,
        )
    context.metrics.observe_notes_write(outcome)  # after the commit: only what was stored
    return outcome == "written"


def blueprint() -> Blueprint:
    """A fresh blueprint per job app (see `app.offload.tasks.blueprint`)."""
    tasks = Blueprint()
    tasks.task(name="refresh", queue=DEFAULT_QUEUE, pass_context=True, retry=DEFAULT_RETRY)(refresh)
    return tasks
