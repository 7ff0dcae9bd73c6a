"""Migration 0010: jobs queued before the upgrade move to the queue and priority their task is
given now (`app.jobs.queue.QUEUE`, `PRIORITY`)."""

import asyncio
import uuid

from alembic import command
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from app.core.migrate import alembic_config, upgrade
from app.jobs.queue import PRIORITY, QUEUE, TaskName
from tests.support.factories import transaction

OWN_DATABASE = True  # it migrates its database down and up again


async def test_pending_jobs_move_to_their_queue_and_priority(
    engine: AsyncEngine, settings: Settings
) -> None:
    url = settings.database_url or ""
    await asyncio.to_thread(command.downgrade, alembic_config(url), "0009")
    marker = uuid.uuid4().hex
    async with transaction(engine) as db:
        for task in TaskName:  # as the previous version queued them: one queue, priority 0
            await db.execute(
                text(
                    "SELECT procrastinate_defer_jobs_v1(ARRAY[ROW('contextd', :task, 0, NULL,"
                    " NULL, CAST(:args AS jsonb), NULL)]::procrastinate_job_to_defer_v1[])"
                ),
                {"task": task.value, "args": f'{{"marker": "{marker}"}}'},
            )
    await asyncio.to_thread(upgrade, url)
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT task_name, queue_name, priority FROM procrastinate_jobs"
                " WHERE args->>'marker' = :m"
            ),
            {"m": marker},
        )
        moved = {task: (queue, priority) for task, queue, priority in rows}
    assert moved == {task.value: (QUEUE[task], PRIORITY[task]) for task in TaskName}
