"""Jobs already queued move to the queue and priority they are given now (`app.jobs.queue`).

A session's offload, notes and erase run at priority 10 in the `contextd` queue; embeddings and
the sweeps at priority 0 in `contextd-background`, which the slots a worker keeps for sessions'
jobs never take. Without this, jobs queued before the upgrade would run as before once: an
embedding in a kept slot, a session's notes behind embeddings. Names are written out: a
migration must not change when the code does.

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SESSION_TASKS = "('offload:run', 'notes:refresh', 'memory:erase')"
BACKGROUND_TASKS = (
    "('offload:embed_chunks', 'memory:embed', 'offload:sweep', 'memory:sweep_embeddings')"
)
PENDING = "status IN ('todo', 'doing')"


def upgrade() -> None:
    op.execute(
        f"UPDATE procrastinate_jobs SET queue_name = 'contextd-background'"
        f" WHERE {PENDING} AND task_name IN {BACKGROUND_TASKS}"
    )
    op.execute(
        f"UPDATE procrastinate_jobs SET priority = 10 WHERE {PENDING} AND task_name IN {SESSION_TASKS}"
    )


def downgrade() -> None:
    op.execute(
        f"UPDATE procrastinate_jobs SET queue_name = 'contextd', priority = 0"
        f" WHERE {PENDING} AND task_name IN {BACKGROUND_TASKS}"
    )
    op.execute(
        f"UPDATE procrastinate_jobs SET priority = 0 WHERE {PENDING} AND task_name IN {SESSION_TASKS}"
    )
