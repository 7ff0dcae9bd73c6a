"""The worker's sweep selects sessions over their watermark in SQL: pinned to the budget kernel."""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from app.store import sessions as sessions_store
from app.store.models import Session
from app.store.sessions import session_budget
from tests.support.factories import new_caller, transaction

# (stored config, c0 or None, c1, c2): around the trigger, with and without overrides.
CASES: list[tuple[dict[str, Any], int | None, int, int]] = [
    ({}, None, 1_000, 0),
    ({}, 2_000, 93_444, 400),  # ratio just below 0.8 without priming, at it with priming
    ({"context_limit": 16_000, "reserve_tokens": 2_000}, 500, 10_500, 200),
    ({"context_limit": 16_000, "reserve_tokens": 2_000, "trigger_ratio": 0.9}, 500, 11_500, 200),
    ({"context_limit": 16_000, "reserve_tokens": 2_000, "c0_tokens": 3_000}, None, 8_200, 0),
    ({"c0_tokens": 90_000}, None, 5_900, 0),
    ({"context_limit": 8_000, "reserve_tokens": 1_000}, 0, 5_597, 0),  # exactly at θ
    ({"context_limit": 8_000, "reserve_tokens": 1_000}, 0, 5_596, 0),  # one token below θ
]


@pytest.fixture
async def sessions(engine: AsyncEngine, settings: Settings) -> list[Session]:
    caller = await new_caller(engine)
    ids = []
    async with transaction(engine) as db:
        for i, (config, c0, c1, c2) in enumerate(CASES):
            row = await sessions_store.lock_or_create_session(db, caller.tenant_id, f"s{i}")
            await db.execute(
                update(Session)
                .where(Session.id == row.id)
                .values(config=config, c0_tokens=c0, c1_tokens=c1, c1_turns=1, c2_tokens=c2)
            )
            ids.append(row.id)
    async with transaction(engine) as db:
        found = await db.execute(select(Session).where(Session.id.in_(ids)))
        by_id = {s.id: s for s in found.scalars()}
    return [by_id[i] for i in ids]


async def test_sql_ratio_equals_the_kernel_ratio(
    engine: AsyncEngine, settings: Settings, sessions: list[Session]
) -> None:
    defaults = settings.session_defaults
    async with transaction(engine) as db:
        rows = await db.execute(
            select(Session.id, sessions_store.usage_ratio_sql(defaults)).where(
                Session.id.in_([s.id for s in sessions])
            )
        )
        sql = {pk: ratio for pk, ratio in rows.all()}
    for session in sessions:
        assert sql[session.id] == pytest.approx(session_budget(settings, session).ratio())


async def test_sweep_selects_exactly_the_sessions_the_kernel_puts_over_trigger(
    engine: AsyncEngine, settings: Settings, sessions: list[Session]
) -> None:
    async with transaction(engine) as db:
        over = {
            key.id
            for key in await sessions_store.sessions_over_watermark(
                db, settings.session_defaults, datetime.now(UTC) - timedelta(hours=1), limit=100_000
            )
        }
    expected = {s.id for s in sessions if session_budget(settings, s).level() != "normal"}
    assert {s.id for s in sessions} & over == expected
    assert expected and expected != {s.id for s in sessions}  # the cases fall on both sides
    assert uuid.UUID(int=0) not in over
