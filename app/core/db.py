"""Async SQLAlchemy engine and the per-request unit of work.

The outer layer owns the transaction: `unit_of_work` commits once on success and rolls back on any
error, so services only flush and nothing is ever half-written.
"""

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.core.config import Settings


def create_engine(settings: Settings) -> AsyncEngine:
    return create_async_engine(
        settings.sqlalchemy_url,
        pool_size=settings.db.pool_size,
        max_overflow=settings.db.max_overflow,
        pool_pre_ping=True,
        # Database errors are logged; their SQL parameters hold conversation text.
        hide_parameters=not settings.log_text,
    )


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False, autoflush=False)


@asynccontextmanager
async def unit_of_work(maker: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    async with maker() as session:
        try:
            yield session
        except BaseException:
            await session.rollback()
            raise
        await commit(session)


AfterCommit = Callable[[], Awaitable[None]]


def after_commit(db: AsyncSession, action: AfterCommit) -> None:
    """Run `action` once the surrounding unit of work has committed (e.g. cache invalidation)."""
    db.info.setdefault("after_commit", []).append(action)


async def commit(db: AsyncSession) -> None:
    """Commit, then run the after-commit actions registered during the transaction."""
    await db.commit()
    actions: list[AfterCommit] = db.info.pop("after_commit", [])
    for action in actions:
        await action()
