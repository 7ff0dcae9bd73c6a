"""Worker jobs of the append: the hourly purge of idempotency records past their lifetime."""

from datetime import timedelta

from procrastinate import Blueprint, JobContext

from app.core.db import unit_of_work
from app.jobs.queue import BACKGROUND_QUEUE, app_context
from app.store import turns as turns_store

# One transaction deletes at most this many records: a backlog (a first run on an old database)
# goes in short transactions, never one that holds a million row locks.
PURGE_BATCH = 5_000


async def purge_idempotency_records(job_context: JobContext, timestamp: int) -> int:
    """A replay is answered for `db.idempotency_ttl_hours` (an older record is claimed again as
    new); past that its record, with the response it stored, is only weight: deleted here."""
    context = app_context(job_context)
    lifetime = timedelta(hours=context.settings.db.idempotency_ttl_hours)
    purged = 0
    while True:
        async with unit_of_work(context.sessionmaker) as db:
            gone = await turns_store.purge_idempotency_records(db, lifetime, PURGE_BATCH)
        purged += gone
        if gone < PURGE_BATCH:
            return purged


def blueprint() -> Blueprint:
    """A fresh blueprint per job app (see `app.offload.tasks.blueprint`)."""
    tasks = Blueprint()
    tasks.periodic(cron="17 * * * *", periodic_id="purge_idempotency")(
        tasks.task(name="purge_idempotency", queue=BACKGROUND_QUEUE, pass_context=True)(
            purge_idempotency_records
        )
    )
    return tasks
