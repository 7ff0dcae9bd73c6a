"""The offload's trigger: after a change of a session's usage, enqueue an offload when the
budget crosses the watermark. The append, build-prompt and the sweep's repair call it."""

from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.budget import Budget, Observation
from app.jobs.queue import enqueue_offload
from app.store.models import Session


async def observe_watermark(db: AsyncSession, budget: Budget, session: Session) -> Observation:
    """After a change of the session's usage: enqueue an offload when the budget fires.
    The returned `armed` is stored by the caller with its update of the session row."""
    observation = budget.observe(session.offload_armed)
    if observation.fired:
        await enqueue_offload(db, session.key, trigger="watermark")
    return observation
