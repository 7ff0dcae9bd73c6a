"""Session-wide real services: embedded PostgreSQL+pgvector and Valkey, migrated once.

Tests are isolated by tenant: each test gets a fresh tenant and API key, so tests can run in any
order against the one database. A module that runs a worker declares `OWN_DATABASE = True` and
gets a fresh copy of the migrated schema for itself (`settings`, `engine`, `cache` and the key
fixtures follow it): a worker takes every pending job of its database, and the rest of the suite
leaves jobs behind that no worker of theirs runs.
"""

import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.auth.service import create_key
from app.core.cache import Cache
from app.core.config import Settings, load_settings, to_sqlalchemy_url
from app.core.db import create_sessionmaker, unit_of_work
from app.core.migrate import upgrade
from app.domain.callers import ALL_SCOPES, DEFAULT_SCOPES
from app.runtime.embedded import EmbeddedStack
from tests.examples.fake_model import MODEL, chat_model
from tests.support.databases import create_template, fresh_database
from tests.support.loopback import LoopbackServer, loopback_server
from tests.support.server import RunningServer, run_server


@pytest.fixture(scope="session")
def stack() -> Iterator[EmbeddedStack]:
    with tempfile.TemporaryDirectory(prefix="contextd-test-") as tmp:
        started = EmbeddedStack(Path(tmp), persist=False).start()
        upgrade(started.database_url)
        try:
            yield started
        finally:
            started.stop()


@pytest.fixture(scope="session")
def template(stack: EmbeddedStack) -> None:
    """The migrated template that modules with a database of their own copy."""
    create_template(stack.database_url)


@pytest.fixture(scope="session")
def shared_settings(stack: EmbeddedStack) -> Settings:
    """Lexical-only by default (fast); tests about vectors build settings with an embedder."""
    return load_settings(
        database_url=stack.database_url,
        redis_url=stack.redis_url,
        embedding={"kind": "none"},
        worker={
            "heartbeat_seconds": 0.5,
            "stalled_after_seconds": 2,
            "maintenance_interval_seconds": 0.5,
        },
    )


@pytest.fixture(scope="module")
def settings(
    request: pytest.FixtureRequest, shared_settings: Settings, stack: EmbeddedStack
) -> Iterator[Settings]:
    """The suite's settings, on a database of the module's own when it sets OWN_DATABASE."""
    if not getattr(request.module, "OWN_DATABASE", False):
        yield shared_settings
        return
    request.getfixturevalue("template")
    with fresh_database(stack.database_url) as url:
        yield shared_settings.model_copy(update={"database_url": url})


@pytest.fixture(scope="session")
def server(shared_settings: Settings) -> Iterator[RunningServer]:
    """The API on the shared database (modules with their own database start their own)."""
    with run_server(shared_settings) as running:
        yield running


@pytest.fixture(scope="module")
def contextd(settings: Settings) -> Iterator[RunningServer]:
    """API and worker in one process, on the module's database (the module declares
    `OWN_DATABASE = True`); `contextd dev` runs its worker in a child process
    (tests/runtime/test_dev_worker.py)."""
    with run_server(settings, with_worker=True) as running:
        yield running


@pytest.fixture(scope="module")
def model() -> Iterator[LoopbackServer]:
    """The deterministic OpenAI-compatible chat model of `tests/examples/fake_model.py`."""
    with loopback_server(chat_model(MODEL)) as server:
        yield server


@pytest.fixture(scope="module")
async def engine(settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(to_sqlalchemy_url(settings.database_url or ""))
    yield engine
    await engine.dispose()


async def new_key(engine: AsyncEngine, tenant: str, scopes: list[str]) -> str:
    async with unit_of_work(create_sessionmaker(engine)) as db:
        key, _ = await create_key(db, tenant, scopes)
    return key


@pytest.fixture
def tenant_name() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def api_key(engine: AsyncEngine, tenant_name: str) -> str:
    return await new_key(engine, tenant_name, [s.value for s in DEFAULT_SCOPES])


@pytest.fixture
async def admin_key(engine: AsyncEngine, tenant_name: str) -> str:
    """A key of the same tenant with every scope (memory:offload, memory:forget)."""
    return await new_key(engine, tenant_name, [s.value for s in ALL_SCOPES])


@pytest.fixture
async def client(server: RunningServer, api_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:
        yield http


@pytest.fixture
async def admin(server: RunningServer, admin_key: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `server` with `admin_key` (every scope)."""
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
    ) as http:
        yield http


@pytest.fixture(scope="module")
async def cache(settings: Settings) -> AsyncIterator[Cache]:
    real = Cache(settings.redis_url, settings.cache)
    yield real
    await real.aclose()


@pytest.fixture(scope="module")
def e5_server(settings: Settings) -> Iterator[RunningServer]:
    """The API and its worker with e5 embeddings, on the module's database (recall tests)."""
    own = settings.model_copy(
        update={"embedding": settings.embedding.model_copy(update={"kind": "e5"})}
    )
    with run_server(own, with_worker=True) as server:
        yield server


@pytest.fixture
async def e5_client(e5_server: RunningServer, api_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=e5_server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
    ) as http:
        yield http
