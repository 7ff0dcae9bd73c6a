"""Process-wide resources, built once in the lifespan and handed to endpoints and jobs.

Nothing here is a module global: the API builds one `AppContext` per application instance and the
worker one per process, so tests can run several instances side by side.
"""

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import create_engine, create_sessionmaker


@dataclass
class AppContext:
    settings: Settings
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    cache: Cache
    # Optional parts (embedder, reranker, LLM client) registered by the domains that own them.
    extras: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, settings: Settings) -> "AppContext":
        engine = create_engine(settings)
        return cls(
            settings=settings,
            engine=engine,
            sessionmaker=create_sessionmaker(engine),
            cache=Cache(settings.redis_url, settings.cache),
        )

    async def aclose(self) -> None:
        await self.cache.aclose()
        await self.engine.dispose()
