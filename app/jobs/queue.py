"""Jobs: transactional enqueue into procrastinate's tables, and what every task shares (the retry
policy, the process's `AppContext`).

A job row is inserted with `procrastinate_defer_jobs_v1` on the caller's own connection, inside the
caller's transaction: the job exists if and only if the write that needs it commits. A pending job
with the same `queueing_lock` makes the insert a no-op (one pending offload per session).

A worker takes the waiting job of the highest priority first, the oldest among equals
(`procrastinate_fetch_job_v2`): offloads, notes and erasure go before embeddings (`PRIORITY`),
and they have slots of their own (`DEFAULT_QUEUE`).
"""

import json
import uuid
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from procrastinate import JobContext, RetryStrategy
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.context import AppContext
from app.core.db import unit_of_work
from app.store import sessions as sessions_store
from app.store.jobs import defer_job, pending_under, waiting_under
from app.store.models import SessionKey

# A session's short jobs (offload, notes, erasure) and the long background work (embeddings,
# sweeps, vector index builds): see `QUEUE`.
DEFAULT_QUEUE = "contextd"
BACKGROUND_QUEUE = "contextd-background"
# Offload, embedding, notes and erase jobs are idempotent, so retrying them is always safe.
DEFAULT_RETRY = RetryStrategy(max_attempts=8, exponential_wait=2)


def app_context(job_context: JobContext) -> AppContext:
    """The worker process's resources, handed to every task (tasks reload state by id)."""
    context: AppContext = job_context.additional_context["app"]
    return context


async def session_of_job(
    context: AppContext, tenant_id: str | None, session_pk: str
) -> SessionKey | None:
    """The session a job names, by tenant and id. Every job naming a session carries its tenant
    (`tenant_id`), so that what it reads and locks names the tenant; a job queued by a version
    before that has none, and such jobs stay queued across a rolling upgrade: its tenant is read
    once from the session row. None when the session is gone."""
    pk = uuid.UUID(session_pk)
    if tenant_id is not None:
        return SessionKey(uuid.UUID(tenant_id), pk)
    async with unit_of_work(context.sessionmaker) as db:
        tenant = (await sessions_store.tenants_of_sessions(db, [pk])).get(pk)
    return None if tenant is None else SessionKey(tenant, pk)


class TaskName(StrEnum):
    """Full names (blueprint namespace + task) of the jobs enqueued by name: the API's, and the
    sweep (periodic, and run at once by whoever needs the counters repaired now)."""

    OFFLOAD = "offload:run"
    EMBED_CHUNKS = "offload:embed_chunks"
    REFRESH_NOTES = "notes:refresh"
    ERASE = "memory:erase"
    EMBED_MEMORIES = "memory:embed"
    SWEEP = "offload:sweep"


# A session's offload, notes and erase are short and what its next prompt waits for; embeddings
# are the long tail (one e5 batch takes seconds, and an offload queues several). In one FIFO
# queue every embedding job queued before a session's notes ran first: a session's notes stayed
# at version 0 for 40 offloads while the worker embedded another tenant's backlog. Now the
# session's jobs take any free slot before an embedding (`PRIORITY`), and every worker process
# keeps `worker.session_slots` slots that serve only their queue (`app.runtime.worker`): they never
# wait for a batch or an index build to end. A session's offload, notes and erase share its
# lock and so must share a priority: procrastinate orders a lock's jobs by priority before age,
# and these must run in the order they were queued.
QUEUE: dict[TaskName, str] = {
    TaskName.OFFLOAD: DEFAULT_QUEUE,
    TaskName.REFRESH_NOTES: DEFAULT_QUEUE,
    TaskName.ERASE: DEFAULT_QUEUE,
    TaskName.EMBED_CHUNKS: BACKGROUND_QUEUE,
    TaskName.EMBED_MEMORIES: BACKGROUND_QUEUE,
    TaskName.SWEEP: BACKGROUND_QUEUE,
}
PRIORITY: dict[TaskName, int] = {
    TaskName.OFFLOAD: 10,
    TaskName.REFRESH_NOTES: 10,
    TaskName.ERASE: 10,
    TaskName.EMBED_CHUNKS: 0,
    TaskName.EMBED_MEMORIES: 0,
    TaskName.SWEEP: 0,
}
# A session's chunk embedding jobs also step down by the jobs already waiting under their lock
# (one lock per session): a session's first job goes before any session's second, so a session
# whose offloads queued a long backlog does not hold back another's vectors until that backlog
# is done (first come, first served left a second tenant's chunks without vectors for over two
# minutes, docs/BENCHMARKS.md). Per session, not per tenant: a tenant with many sessions gets a
# turn for each. The jobs are independent, so their order within the lock may change.
BY_LOCK_BACKLOG = frozenset({TaskName.EMBED_CHUNKS})


async def enqueue(
    db: AsyncSession,
    task_name: TaskName,
    args: dict[str, Any],
    *,
    lock: str | None = None,
    queueing_lock: str | None = None,
    delay_seconds: float | None = None,
) -> bool:
    """Insert a job in the current transaction. False when an identical job is already pending."""
    scheduled_at = (
        datetime.now(UTC) + timedelta(seconds=delay_seconds) if delay_seconds is not None else None
    )
    priority = PRIORITY[task_name]
    if task_name in BY_LOCK_BACKLOG and lock is not None:
        priority -= await waiting_under(db, lock)
    params = {
        "queue": QUEUE[task_name],
        "task": task_name,
        "priority": priority,
        "lock": lock,
        "queueing_lock": queueing_lock,
        "args": json.dumps(args),
        "scheduled_at": scheduled_at,
    }
    try:
        await defer_job(db, params)
    except IntegrityError:
        return False  # queueing lock held by a pending job: the work is already scheduled
    return True


def session_lock(session_pk: uuid.UUID) -> str:
    """The procrastinate lock shared by the offload, notes and erase jobs of one session: they
    run one at a time, in order."""
    return f"session:{session_pk}"


def embedding_lock(session_pk: uuid.UUID) -> str:
    """The lock of one session's chunk embedding jobs: they run one at a time, apart from its
    other jobs. Procrastinate keeps a job behind every earlier job of its lock that is running
    or waiting, a failed one waiting for its retry included: under the session lock, an embedder
    that was down or hanging held the session's notes and offloads back for as long as the
    embedding's retries lasted (`DEFAULT_RETRY`: 2, 4, ..., 256 s apart, 8.5 minutes in all).
    Neither needs a vector."""
    return f"embeddings:{session_pk}"


def session_args(session: SessionKey) -> dict[str, str]:
    """The arguments naming a session in a job: its id and its tenant."""
    return {"tenant_id": str(session.tenant_id), "session_pk": str(session.id)}


async def enqueue_offload(db: AsyncSession, session: SessionKey, *, trigger: str) -> bool:
    """One pending offload per session at most (queueing lock); runs under the session lock."""
    return await enqueue(
        db,
        TaskName.OFFLOAD,
        {**session_args(session), "trigger": trigger},
        lock=session_lock(session.id),
        queueing_lock=f"offload:{session.id}",
    )


async def pending_jobs(db: AsyncSession, session_pk: uuid.UUID) -> int:
    """Jobs of one session waiting or running (those under its lock and its embedding jobs)."""
    return await pending_under(db, session_lock(session_pk), embedding_lock(session_pk))
