"""Process-wide resources, built once in the lifespan and handed to endpoints and jobs.

Nothing here is a module global: the API builds one `AppContext` per application instance and the
worker one per process, so tests can run several instances side by side.
"""

import asyncio
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
import numpy as np
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.core.breaker import CircuitBreaker
from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import (
    ReaderPool,
    Replica,
    create_engine,
    create_reader_pool,
    create_sessionmaker,
)
from app.core.lru import LRU, VersionedLRU
from app.core.observability import Metrics
from app.core.ratelimit import RateLimiter
from app.embeddings.base import Embedder, EmbedderUnavailable
from app.embeddings.factory import create_embedder, embedder_from_settings
from app.embeddings.reranker import MiniLMReranker

logger = logging.getLogger("contextd.embeddings")
MEANING_LINES = 8192  # 16 MB of USE vectors at most
T = TypeVar("T")


class LoadedOnce(Generic[T]):
    """A model this process loads in a thread on its first need, once: `get` waits for a load
    under way and returns None when it cannot load (logged once; the caller goes on without)."""

    def __init__(self, load: Callable[[], T | None], what: str) -> None:
        self._load = load
        self._what = what
        self._lock: asyncio.Lock | None = None  # None: not tried yet
        self.value: T | None = None

    async def get(self) -> T | None:
        if self._lock is None:
            self._lock = asyncio.Lock()
            async with self._lock:
                try:
                    self.value = await asyncio.to_thread(self._load)
                except EmbedderUnavailable as exc:
                    logger.warning("going on without %s: %s", self._what, exc)
        else:
            async with self._lock:  # another request is loading it
                pass
        return self.value


@dataclass
class AppContext:
    settings: Settings
    engine: AsyncEngine
    reader: ReaderPool  # autocommit single-statement reads of the hot path (`read_once`)
    sessionmaker: async_sessionmaker[AsyncSession]
    cache: Cache
    http: httpx.AsyncClient  # outbound calls: LLM notes, rerank, query rewrite
    # Recall's per-session BM25 indexes and shown chunks' turns (`app.recall.session_chunks`) here.
    lexical_indexes: VersionedLRU[Any]
    # What build-prompt read of a session, kept by version: its window by the session row's
    # version (`app.prompt.snapshot`), its notes by the notes version (`app.prompt.gather`).
    windows: VersionedLRU[Any]
    notes: VersionedLRU[Any]
    metrics: Metrics  # this instance's Prometheus registry (shared with a worker in this process)
    rate_limiter: RateLimiter  # per-minute limits: Redis, else counted in this process
    query_embedder: CircuitBreaker  # skips the embedder in recall while it keeps failing
    embedder: Embedder | None = None  # set by `start_embedder`; None means lexical recall only
    # The multilingual USE, for the relevance floor's judgement by meaning
    # (`app.recall.judging`, ~2 s and ~230 MB resident to load), and the English cross-encoder
    # (`recall.cross_encoder`, ~0.3 s, ~110 MB): each loaded on its first need, so a process
    # never asked for one never loads it.
    meaning: "LoadedOnce[Embedder]" = field(
        default_factory=lambda: LoadedOnce(lambda: create_embedder("use"), "USE")
    )
    reranker: "LoadedOnce[MiniLMReranker]" = field(
        default_factory=lambda: LoadedOnce(MiniLMReranker, "the cross-encoder")
    )
    # USE's vectors of chunks' lines (a line's vector never changes; a session's recalls meet
    # the same chunks again): ~2 ms a line to encode, 2 KB to keep.
    meaning_lines: LRU[str, np.ndarray] = field(default_factory=lambda: LRU(MEANING_LINES))
    replica: Replica | None = None  # the read-only endpoints' replica (`DATABASE_REPLICA_URL`)

    @classmethod
    def create(cls, settings: Settings, metrics: Metrics | None = None) -> "AppContext":
        engine = create_engine(settings)
        cache = Cache(settings.redis_url, settings.cache)
        replica_url = settings.replica_sqlalchemy_url
        return cls(
            settings=settings,
            engine=engine,
            reader=create_reader_pool(settings),
            sessionmaker=create_sessionmaker(engine),
            cache=cache,
            http=httpx.AsyncClient(timeout=10.0),
            lexical_indexes=VersionedLRU(settings.recall.lexical_index_cache_sessions),
            windows=VersionedLRU(settings.recall.lexical_index_cache_sessions),
            notes=VersionedLRU(settings.recall.lexical_index_cache_sessions),
            metrics=metrics or Metrics(),
            rate_limiter=RateLimiter(cache),
            query_embedder=CircuitBreaker(
                settings.recall.embedder_breaker_failures,
                settings.recall.embedder_breaker_cooldown_seconds,
            ),
            replica=Replica(settings, replica_url) if replica_url else None,
        )

    async def start_embedder(self, warm: Collection[str] = ("query", "passage")) -> None:
        """Load the configured embedder once and warm up its encoders of the kinds this process
        embeds (a local encoder's engine process then starts now, not on the first call)."""
        self.embedder = embedder_from_settings(self.settings.embedding)
        if self.embedder is None:
            return
        self.embedder.observer = self.metrics.observe_embed
        warm_up = getattr(self.embedder, "warm_up", None)
        if warm_up is not None:
            await warm_up(warm)

    async def aclose(self) -> None:
        for embedder in (self.embedder, self.meaning.value):
            if embedder is not None:
                await embedder.aclose()
        await self.http.aclose()
        await self.cache.aclose()
        await self.engine.dispose()
        await self.reader.dispose()
        if self.replica is not None:
            await self.replica.dispose()
