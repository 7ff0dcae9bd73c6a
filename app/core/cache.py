"""Redis (or Valkey) as a cache only: every read falls back to Postgres when it is unreachable.

Keys are `<prefix>:v1:<kind>:<parts...>`. After an error the cache steps aside for
`retry_after_seconds`, so a dead Redis costs one timeout, not one per request; callers learn of the
bypass through `Cache.bypassed` and report the `cache_bypass` fallback.
"""

import json
import logging
import time
from typing import Any

import redis.asyncio as redis
from redis.exceptions import RedisError

from app.core.config import CacheSettings

logger = logging.getLogger("contextd.cache")

SCHEMA_VERSION = "v1"


class Cache:
    def __init__(self, url: str | None, settings: CacheSettings) -> None:
        self._settings = settings
        self._client: redis.Redis | None = (
            redis.Redis.from_url(
                url,
                socket_connect_timeout=settings.socket_timeout_seconds,
                socket_timeout=settings.socket_timeout_seconds,
                retry_on_timeout=False,
            )
            if url
            else None
        )
        self._down_until = 0.0
        # Invalidations that could not reach Redis; replayed before the next successful use so a
        # write made during an outage never leaves an old value to be served after it.
        self._pending_deletes: set[str] = set()

    @property
    def client(self) -> redis.Redis | None:
        return self._client

    @property
    def bypassed(self) -> bool:
        """True while the cache is being skipped (unconfigured, or after a recent error)."""
        return self._client is None or time.monotonic() < self._down_until

    def key(self, kind: str, *parts: object) -> str:
        return ":".join([self._settings.key_prefix, SCHEMA_VERSION, kind, *map(str, parts)])

    async def _available(self) -> redis.Redis | None:
        if self.bypassed:
            return None
        assert self._client is not None
        if self._pending_deletes:
            try:
                await self._client.delete(*self._pending_deletes)
                self._pending_deletes.clear()
            except (RedisError, OSError) as exc:
                self._failed(exc)
                return None
        return self._client

    def _failed(self, exc: Exception) -> None:
        logger.warning("redis unavailable, using postgres: %s", exc)
        self._down_until = time.monotonic() + self._settings.retry_after_seconds

    async def get_json(self, key: str) -> Any | None:
        client = await self._available()
        if client is None:
            return None
        try:
            raw = await client.get(key)
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None
        return json.loads(raw) if raw is not None else None

    async def set_json(self, key: str, value: Any, ttl: int | None = None) -> None:
        client = await self._available()
        if client is None:
            return
        try:
            await client.set(
                key, json.dumps(value, default=str), ex=ttl or self._settings.ttl_seconds
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)

    async def delete(self, *keys: str) -> None:
        if not keys or self._client is None:
            return
        client = await self._available()
        if client is None:
            self._pending_deletes.update(keys)
            return
        try:
            await client.delete(*keys)
        except (RedisError, OSError) as exc:
            self._pending_deletes.update(keys)
            self._failed(exc)

    async def incr_window(self, key: str, window_seconds: int) -> int | None:
        """Count an event in a fixed window; None when Redis cannot answer (caller falls back)."""
        client = await self._available()
        if client is None:
            return None
        try:
            async with client.pipeline(transaction=True) as pipe:
                pipe.incr(key)
                pipe.expire(key, window_seconds, nx=True)
                count, _ = await pipe.execute()
            return int(count)
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None

    async def ping(self) -> bool:
        if self._client is None:
            return False
        try:
            return bool(await self._client.ping())
        except (RedisError, OSError):
            return False

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
