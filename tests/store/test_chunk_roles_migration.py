"""Migration 0020: an untrusted chunk written before it takes the roles of the untrusted turns it
covers (a tool turn is stored untrusted, a quarantined turn too), which its label names; one
whose turns name none keeps the label it had (tool output); a trusted chunk takes none."""

import asyncio
import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from app.core.migrate import upgrade
from tests.support.factories import transaction
from tests.support.migrations import session_before

OWN_DATABASE = True  # it migrates its database down and up again

# (seq, role, trusted, quarantined)
TURNS = [
    (1, "user", True, False),
    (2, "assistant", True, False),
    (3, "user", False, True),  # pasted from a source marked untrusted
    (4, "assistant", True, False),
    (5, "tool", False, False),
    (6, "user", False, True),
]
# (turn_first, turn_last, trusted) -> the roles the migration gives it
CHUNKS = {
    (1, 2, True): [],
    (3, 4, False): ["user"],
    (5, 6, False): ["tool", "user"],
    (7, 7, False): ["tool"],  # its turns are gone: the label it had
}


async def test_untrusted_chunks_take_the_roles_of_their_untrusted_turns(
    engine: AsyncEngine, settings: Settings
) -> None:
    _, session_pk = await session_before(engine, settings, "0019", user_id="u-1")
    async with transaction(engine) as db:
        for seq, role, trusted, quarantined in TURNS:
            await db.execute(
                text(
                    "INSERT INTO turns (tenant_id, session_id, seq, role, content, token_count,"
                    " trusted, quarantined_at) SELECT tenant_id, id, :seq, :role, '内容 text', 4,"
                    " :trusted, CASE WHEN :quarantined THEN now() END FROM sessions"
                    " WHERE id = :session"
                ),
                {
                    "seq": seq,
                    "role": role,
                    "trusted": trusted,
                    "quarantined": quarantined,
                    "session": session_pk,
                },
            )
        for first, last, trusted in CHUNKS:
            await db.execute(
                text(
                    "INSERT INTO chunks (id, tenant_id, session_id, turn_first, turn_last,"
                    " ts_first, ts_last, raw_text, token_count, trusted, lexical)"
                    " SELECT :id, tenant_id, id, :first, :last, now(), now(), 'text', 1, :trusted,"
                    " to_tsvector('simple', 'text') FROM sessions WHERE id = :session"
                ),
                {
                    "id": uuid.uuid4(),
                    "first": first,
                    "last": last,
                    "trusted": trusted,
                    "session": session_pk,
                },
            )
    await asyncio.to_thread(upgrade, settings.database_url or "")
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT turn_first, turn_last, trusted, untrusted_roles FROM chunks"
                " WHERE session_id = :session"
            ),
            {"session": session_pk},
        )
        roles = {(first, last, trusted): found for first, last, trusted, found in rows}
    assert roles == CHUNKS
