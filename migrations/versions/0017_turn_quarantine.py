"""Turns can be quarantined: a source marked untrusted after the fact.

`POST /v1/sessions/{id}/sources/untrust` marks the results of a tool, or a turn range, as
untrusted: the turns keep their text (the window and the chunks stay whole) but nothing is
derived from them again — no notes line, on any later notes run or rebuild. Existing turns are
not quarantined.

Revision ID: 0017
Revises: 0016
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("quarantined_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("turns", "quarantined_at")
