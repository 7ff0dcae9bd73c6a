"""Worker job of the notes (C2): refresh after an offload (every Nth version, and on request, a
rebuild from the raw turns: `app.notes.service.compute_notes`)."""

from procrastinate import Blueprint, JobContext

from app.core.db import unit_of_work
from app.jobs.queue import DEFAULT_QUEUE, DEFAULT_RETRY, app_context, session_of_job
from app.notes.service import refresh_notes


async def refresh(
    job_context: JobContext,
    session_pk: str,
    rebuild: bool = False,
    tenant_id: str | None = None,  # None: queued before jobs carried it (`session_of_job`)
) -> bool:
    context = app_context(job_context)
    session = await session_of_job(context, tenant_id, session_pk)
    if session is None:
        return False
    async with unit_of_work(context.sessionmaker) as db:
        outcome = await refresh_notes(
            db,
            context.settings,
            context.cache,
            session.tenant_id,
            session.id,
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
