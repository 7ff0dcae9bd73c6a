"""Worker job of erasure: `memory:erase`, step two of a forget and of a session delete."""

import uuid

from procrastinate import Blueprint, JobContext

from app.core.db import unit_of_work
from app.erasure.erase import run_erase
from app.jobs.queue import DEFAULT_QUEUE, DEFAULT_RETRY, app_context
from app.store import receipts as receipts_store


async def erase(
    job_context: JobContext,
    receipt_id: str,
    tenant_id: str | None = None,  # None: queued before jobs carried it, see below
) -> bool:
    context = app_context(job_context)
    receipt_pk = uuid.UUID(receipt_id)
    if tenant_id is not None:
        tenant = uuid.UUID(tenant_id)
    else:  # queued by a version before jobs carried the tenant: read from the receipt, once
        async with unit_of_work(context.sessionmaker) as db:
            found = await receipts_store.tenant_of_receipt(db, receipt_pk)
        if found is None:
            return False  # the receipt is gone
        tenant = found
    return await run_erase(
        context.sessionmaker, context.settings, context.cache, context.http, tenant, receipt_pk
    )


def blueprint() -> Blueprint:
    """A fresh blueprint per job app (see `app.offload.tasks.blueprint`)."""
    tasks = Blueprint()
    tasks.task(name="erase", queue=DEFAULT_QUEUE, pass_context=True, retry=DEFAULT_RETRY)(erase)
    return tasks
