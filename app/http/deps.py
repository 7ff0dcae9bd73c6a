"""`Annotated` dependency aliases used by every endpoint.

Every dependency is `async def`, also those that do no I/O: FastAPI runs a plain `def` dependency
in its thread pool, a thread hop per request and dependency that costs more than the work itself
(on a busy machine, milliseconds of waiting for a thread and the GIL)."""

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.cache import Cache
from app.core.config import Settings
from app.core.context import AppContext
from app.core.db import commit


async def get_context(request: Request) -> AppContext:
    context: AppContext = request.app.state.context
    return context


ContextDep = Annotated[AppContext, Depends(get_context)]


async def get_settings(context: ContextDep) -> Settings:
    return context.settings


async def get_cache(context: ContextDep) -> Cache:
    return context.cache


async def get_db(context: ContextDep) -> AsyncIterator[AsyncSession]:
    """One transaction per request, committed before the response is sent (scope="function").
    A request that never began one (it read through the reader pool only) holds no connection,
    so its session is not closed: closing costs a task, a shield and a greenlet hop per request
    (SQLAlchemy's cancellation-safe close), for a session with nothing to release."""
    db = context.sessionmaker()
    try:
        yield db
    except BaseException:
        async with db:  # closed, also if this task is being cancelled
            await db.rollback()
        raise
    if db.in_transaction():
        async with db:
            await commit(db)


DbDep = Annotated[AsyncSession, Depends(get_db, scope="function")]


async def get_read_db(context: ContextDep, primary: DbDep) -> AsyncIterator[AsyncSession]:
    """The transaction of an endpoint that only reads: on the replica while it is up and not
    lagging past its bound (`app.core.db.Replica`), else, and without a replica, the request's
    own on the primary (`get_db`, the one the caller was authenticated in: a revoked key stops at
    once, and a request reading from the primary holds one connection)."""
    replica = await context.replica.session() if context.replica is not None else None
    if replica is None:
        context.metrics.observe_db_read("primary")
        yield primary
        return
    context.metrics.observe_db_read("replica")
    async with replica:  # closed, its read-only transaction rolled back, also after an error
        yield replica


def request_db(context: AppContext) -> AbstractAsyncContextManager[AsyncSession]:
    """`get_db` where no dependency solving runs (`app.http.direct`): the same transaction rules."""
    return asynccontextmanager(get_db)(context)


SettingsDep = Annotated[Settings, Depends(get_settings)]
CacheDep = Annotated[Cache, Depends(get_cache)]
ReadDbDep = Annotated[AsyncSession, Depends(get_read_db, scope="function")]
