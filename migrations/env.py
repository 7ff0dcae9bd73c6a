"""Alembic environment: runs migrations over the async engine of the configured database."""

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from app.core.config import to_sqlalchemy_url
from app.store.models import Base

config = context.config
target_metadata = Base.metadata


def _include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """procrastinate owns its tables; autogenerate must not try to drop them."""
    return not (type_ == "table" and name is not None and name.startswith("procrastinate_"))


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection, target_metadata=target_metadata, include_object=_include_object
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(to_sqlalchemy_url(config.get_main_option("sqlalchemy.url") or ""))
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline SQL generation is not supported; run `contextd migrate`")
asyncio.run(_run_async())
