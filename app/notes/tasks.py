"""Worker jobs of the notes (C2): refresh after an offload, periodic rebuild from raw turns."""

import uuid

from procrastinate import Blueprint, JobContext

from app.core.db import unit_of_work
from app.jobs.queue import DEFAULT_QUEUE
from app.jobs.worker import DEFAULT_RETRY, app_context
from app.notes.service import refresh_notes

blueprint = Blueprint()


@blueprint.task(name="refresh", queue=DEFAULT_QUEUE, pass_context=True, retry=DEFAULT_RETRY)
async def refresh(job_context: JobContext, session_pk: str, rebuild: bool = False) -> bool:
    context = app_context(job_context)
    async with unit_of_work(context.sessionmaker) as db:
        return await refresh_notes(
            db,
            context.settings,
            context.cache,
            uuid.UUID(session_pk),
            rebuild=rebuild,
            llm_client=context.http,
        )
