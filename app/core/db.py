"""Async SQLAlchemy engine and the per-request unit of work.

The outer layer owns the transaction: `unit_of_work` commits once on success and rolls back on any
error, so services only flush and nothing is ever half-written. The exception is a wait on the
network: a service first ends its transaction (`release`), so no connection idles in a transaction
and no row lock is held meanwhile. PostgreSQL bounds every statement, lock wait and idle
transaction (`create_engine`). The read-only endpoints may read from a streaming replica instead
(`Replica`).
"""

import asyncio
import logging
import math
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.core.config import Settings
from app.core.errors import transaction_conflict

T = TypeVar("T")
logger = logging.getLogger("contextd.db")


def _milliseconds(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _connect_options(settings: Settings, *extra: str) -> str:
    """Time limits PostgreSQL enforces on every connection: no statement, lock wait or abandoned
    transaction holds a connection (or a session's row) without bound; then `extra` settings
    (`name=value`)."""
    db = settings.db
    limits = [
        f"{name}={_milliseconds(seconds)}"
        for name, seconds in (
            ("statement_timeout", db.statement_timeout_seconds),
            ("lock_timeout", db.lock_timeout_seconds),
            ("idle_in_transaction_session_timeout", db.idle_in_transaction_timeout_seconds),
        )
    ]
    return " ".join(f"-c {setting}" for setting in [*limits, *extra])


def create_engine(
    settings: Settings, url: str | None = None, *extra: str, **connect: object
) -> AsyncEngine:
    """The engine of `settings`' primary, or of `url` with `extra` settings and `connect`
    arguments for its connections."""
    db = settings.db
    return create_async_engine(
        url or settings.sqlalchemy_url,
        pool_size=db.pool_size,
        max_overflow=db.max_overflow,
        pool_pre_ping=True,
        # Database errors are logged; their SQL parameters hold conversation text.
        hide_parameters=not settings.log_text,
        connect_args={"options": _connect_options(settings, *extra), **connect},
    )


# Seconds the replica is behind, measured on the replica alone (no second round trip to the
# primary): 0 while it has replayed all the WAL it received and its WAL receiver runs (it streams);
# else the age of the last commit it replayed, which also grows while it is cut off from the
# primary (no receiver), so a replica that stopped following is soon refused. A replica that
# receives WAL after an idle spell looks as old as that spell until it has replayed it, a moment:
# its reads go to the primary meanwhile, the safe side. Not in recovery (promoted): 0.
REPLICA_LAG = text(
    "SELECT CASE"
    " WHEN NOT pg_is_in_recovery() THEN 0"
    " WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()"
    " AND EXISTS (SELECT FROM pg_stat_wal_receiver) THEN 0"
    " ELSE coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp()), 'Infinity')"
    " END::float8"
)
# A read endpoint never writes; on the replica a write fails anyway, and should the URL name a
# writable server (a promoted replica) nothing is written there either.
REPLICA_OPTIONS = "default_transaction_read_only=on"
# A replica host that does not answer at all (no refusal) holds a request this long at most
# before it reads from the primary (libpq's smallest).
REPLICA_CONNECT_SECONDS = 2


class Replica:
    """A streaming replica the read-only endpoints read from while it answers and is at most
    `db.replica_max_lag_seconds` behind; else they read from the primary (`session`).

    Its lag is measured at most every `db.replica_check_seconds`, by the request that finds the
    last measure due, on the connection it then reads with; the others go by the last verdict.
    A replica that cannot be connected to is not tried again before the next measure is due."""

    def __init__(self, settings: Settings, url: str) -> None:
        self.engine = create_engine(
            settings, url, REPLICA_OPTIONS, connect_timeout=REPLICA_CONNECT_SECONDS
        )
        self.sessionmaker = create_sessionmaker(self.engine)
        self._max_lag = settings.db.replica_max_lag_seconds
        self._every = settings.db.replica_check_seconds
        self._usable: bool | None = None  # None: not measured yet
        self._measured_at = -math.inf

    async def session(self) -> AsyncSession | None:
        """A session on the replica with its transaction begun, or None: read from the primary."""
        now = time.monotonic()
        due = now - self._measured_at >= self._every
        if not (due or self._usable):
            return None
        if due:
            self._measured_at = now  # one measure at a time: the others meanwhile go by the last
        db, usable = self.sessionmaker(), False
        try:
            conn = await db.connection()  # the pool's ping finds a replica that went down
            if due:
                self._judge(float((await conn.execute(REPLICA_LAG)).scalar_one()))
            usable = bool(self._usable)
        except (DBAPIError, OSError) as exc:
            self._judge(math.inf, exc)
        finally:
            if not usable:  # passed over, or this task cancelled: its connection goes back
                async with db:  # closed, also if this task is being cancelled
                    await db.rollback()
        return db if usable else None

    def _judge(self, lag: float, error: BaseException | None = None) -> None:
        usable = lag <= self._max_lag
        if usable is not self._usable:
            if error is not None:
                logger.warning("read replica unreachable, reading from the primary: %s", error)
            elif not usable:
                logger.warning("read replica %.1f s behind, reading from the primary", lag)
            else:
                logger.info("read replica %.3f s behind, reading from it again", lag)
        self._usable = usable

    async def dispose(self) -> None:
        await self.engine.dispose()


# The reader pool runs a few fixed statements, each the same read of one session with other
# values (the session and window, the vector scan with the candidates' rows, the shown chunks'
# turns, the exact arm). psycopg prepares a statement on its fifth run on a connection;
# PostgreSQL then still plans it anew on every run (a "custom plan") as long as the plan it
# would keep for any values looks dearer than the last ones: it always does for a LIMIT or an
# array of ids given as parameters (it assumes 10 % of the rows and 10 ids), so the vector scan
# and the turns read were planned on every build (~0.1-0.3 ms of PostgreSQL CPU each). Kept
# plans instead: a whole session is read the same way whichever session it is (its index, or a
# sequential scan when the table holds one session; measured alike for a 948-chunk session).
# And no parallel workers: a kept plan knows no session, so it takes the exact arm's search of
# one session's terms for one of the table's 0.5 % (25,000 rows at 5 x 10^6 chunks) and, at
# 10^6 sessions, ran it in two workers whose start cost 4.5 ms for a search of 0.05 ms; every
# statement here reads one session's rows through an index.
READER_PLANS = ("plan_cache_mode=force_generic_plan", "max_parallel_workers_per_gather=0")


class ReaderPool:
    """psycopg connections for the hot path's single-statement reads (`read_once`): autocommit
    (no BEGIN or COMMIT round trips), no ping before each use (another round trip), statements
    planned once per connection (`READER_PLANS`). At most `size`, opened when needed and kept:
    a read beyond them waits for one to come back (a read takes a millisecond) instead of
    opening one more, which a pool closes again when it is returned (under concurrency a
    PostgreSQL backend, a fork and a login, every few builds). A connection that is broken, or
    not idle after its read (cancelled mid-statement), is closed, not kept; a connection that
    cannot be opened fails at once (no wait for PostgreSQL to come back).

    Not SQLAlchemy's pool: lending a connection through it (a checkout and a return, each in a
    greenlet) cost ~0.12 ms of CPU a read, twice the statement's own share in this process."""

    def __init__(self, conninfo: str, size: int, options: str) -> None:
        self._conninfo = conninfo
        self._size = size
        self._options = options
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._open = 0  # idle, lent, and being opened
        # Reads waiting for a connection, first come first served: a connection coming back
        # is handed to the first (None: a closed one's place, to open a new one in).
        self._waiters: deque[asyncio.Future[psycopg.AsyncConnection[Any] | None]] = deque()

    @property
    def lent(self) -> int:
        return self._open - len(self._idle)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        conn = await self._get()
        try:
            yield conn
        finally:
            if conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
                await conn.close()
                self._release(None)
            else:
                self._release(conn)

    async def _get(self) -> psycopg.AsyncConnection[Any]:
        if not self._waiters:
            if self._idle:
                return self._idle.pop()
            if self._open < self._size:
                self._open += 1
                return await self._connect()
        waiter: asyncio.Future[psycopg.AsyncConnection[Any] | None]
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            conn = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(waiter.result())  # handed over, then cancelled: the next one's
            raise
        return conn if conn is not None else await self._connect()

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        """A new connection in a place already counted in `_open`."""
        try:
            return await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, options=self._options
            )
        except BaseException:
            self._release(None)
            raise

    def _release(self, conn: psycopg.AsyncConnection[Any] | None) -> None:
        """`conn` back (None: the place of a connection closed or never opened): to the first
        waiting read, else kept idle."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is None:
            self._open -= 1
        else:
            self._idle.append(conn)

    async def dispose(self) -> None:
        """Close the idle connections (one lent is closed when it comes back broken)."""
        idle, self._idle = self._idle, []
        self._open -= len(idle)
        for conn in idle:
            await conn.close()


def create_reader_pool(settings: Settings) -> ReaderPool:
    """The reader pool of `settings`: `db.pool_size` connections at most."""
    url = settings.sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)
    return ReaderPool(url, settings.db.pool_size, _connect_options(settings, *READER_PLANS))


async def driver_connection(conn: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """psycopg's own connection under SQLAlchemy's `conn`, for a statement run by the driver
    itself (SQLAlchemy's statement machinery and result processing cost more than a read)."""
    raw = await conn.get_raw_connection()
    return raw.driver_connection  # type: ignore[return-value]


async def read_once(
    reader: ReaderPool, read: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]
) -> T:
    """`read(connection)` on the reader pool, one idempotent statement. When the connection
    turns out dead (PostgreSQL restarted since it was last used) the pool's idle connections
    are dropped and the read runs once more on a new one. A connection that cannot be opened,
    a second failure, or a statement failing on a live connection (a time limit) is
    SQLAlchemy's `OperationalError`, as any other statement's (a 503)."""
    for attempt in (1, 2):
        try:
            async with reader.connection() as driver:
                try:
                    return await read(driver)
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    if not driver.broken or attempt == 2:
                        raise OperationalError(None, None, exc) from exc
        except psycopg.OperationalError as exc:  # opening a connection failed
            raise OperationalError(None, None, exc) from exc
        await reader.dispose()  # the other pooled connections died with it
    raise AssertionError("unreachable")


async def local_time_limits(db: AsyncSession, seconds: float) -> None:
    """Tighter statement and lock timeouts until the current transaction (or the savepoint they
    are set in) ends: a wait that must stay short fails cleanly in PostgreSQL, so the savepoint
    rolls back and the transaction goes on, where cancelling the query from Python would leave
    the connection in doubt."""
    limit = f"{_milliseconds(seconds)}ms"
    await db.execute(
        text(
            "SELECT set_config('lock_timeout', :limit, true), "
            "set_config('statement_timeout', :limit, true)"
        ),
        {"limit": limit},
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


async def release(db: AsyncSession) -> None:
    """End the current transaction before a wait on the network (an embedder, a rerank or chat
    API): no connection sits idle in a transaction, and no row lock is held, while another
    service answers. What the transaction wrote is committed (callers write before they wait);
    the next statement begins a new transaction."""
    if db.in_transaction():
        await commit(db)


TRANSACTION_ATTEMPTS = 4
RETRY_PAUSE_SECONDS = 0.05  # before the 2nd attempt; doubled before each next one, jittered


async def retrying_transaction(
    db: AsyncSession, work: Callable[[], Awaitable[T]], *, attempts: int = TRANSACTION_ATTEMPTS
) -> T:
    """`work()` in a transaction of its own on `db`, committed (what `db` had open is committed
    first, as `release` does). When PostgreSQL ends it to break a deadlock or a serialization
    failure, it is rolled back and run again after a short jittered pause, up to `attempts`
    times; then `app.core.errors.TransactionConflict` (409) with the cause. A rollback expires
    every object `db` loaded: `work` reloads what it uses, by primary key."""
    await release(db)
    for attempt in range(1, attempts + 1):
        try:
            result = await work()
            await commit(db)
            return result
        except DBAPIError as exc:
            await db.rollback()
            db.info.pop("after_commit", None)  # actions of the rolled back attempt
            conflict = transaction_conflict(exc, attempt)
            if conflict is None:
                raise
            if attempt == attempts:
                raise conflict from exc
            logger.warning("%s; attempt %d of %d", conflict.message, attempt, attempts)
            await asyncio.sleep(RETRY_PAUSE_SECONDS * 2 ** (attempt - 1) * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")
