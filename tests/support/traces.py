"""Where an erased text could still be: every text column of every table, every Redis string."""

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache


async def all_text(engine: AsyncEngine, marker: str) -> list[str]:
    """Every (table.column) of every table whose text or jsonb value contains `marker`."""
    async with engine.connect() as conn:
        columns = (
            await conn.execute(
                text(
                    "SELECT table_schema, table_name, column_name, data_type"
                    " FROM information_schema.columns"
                    " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
                    " AND data_type IN"
                    " ('text', 'character varying', 'jsonb', 'json', 'tsvector', 'ARRAY')"
                )
            )
        ).all()
        hits = []
        for schema, table, column, _ in columns:
            found = await conn.execute(
                text(f'SELECT 1 FROM "{schema}"."{table}" WHERE "{column}"::text ILIKE :m LIMIT 1'),
                {"m": f"%{marker}%"},
            )
            if found.first():
                hits.append(f"{table}.{column}")
    return hits


async def redis_hits(cache: Cache, marker: str) -> list[str]:
    """Every key under the cache's prefix whose string value contains `marker`."""
    client = cache.client
    assert client is not None
    hits = []
    async for key in client.scan_iter(match=f"{cache.prefix}:*", count=1000):
        if await client.type(key) == b"string":
            value = await client.get(key)
            if value and marker.encode() in value:
                hits.append(key.decode())
    return hits
