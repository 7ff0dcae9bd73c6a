"""Per-minute rate limits, counted in Redis and, while Redis is unreachable, in this process.

The Redis count is shared by every API process. The local count is a fallback: with Redis down,
each process enforces the limit on its own (N processes let through at most N times the limit),
which still stops a flood that Redis's absence would otherwise let through unbounded.
"""

import time

from app.core.cache import Cache
from app.core.errors import RateLimited

WINDOW_SECONDS = 60
_PRUNE_ABOVE = 10_000  # local counters kept before those of past windows are dropped


class RateLimiter:
    def __init__(self, cache: Cache) -> None:
        self._cache = cache
        self._local: dict[str, tuple[float, int]] = {}  # key -> (window start, count)

    async def hit(self, key: str) -> int:
        """Count one event under `key`; the number of events in its current window (a window
        starts with its first event and lasts `WINDOW_SECONDS`, in Redis as here)."""
        return await self._count(self._cache.key("rate", key))

    async def hit_session(self, what: str, tenant_id: object, session_id: str) -> int:
        """`hit` for a limit of one session, counted in its slot with its other keys."""
        return await self._count(self._cache.session_key(f"rate:{what}", tenant_id, session_id))

    async def _count(self, cache_key: str) -> int:
        shared = await self._cache.incr_window(cache_key, WINDOW_SECONDS)
        local = self._count_locally(cache_key)
        return shared if shared is not None else local

    def _count_locally(self, key: str) -> int:
        """Always counted, so that a Redis outage starts from what this process already saw."""
        now = time.monotonic()
        start, count = self._local.get(key, (now, 0))
        if now - start >= WINDOW_SECONDS:
            start, count = now, 0
        self._local[key] = (start, count + 1)
        if len(self._local) > _PRUNE_ABOVE:
            self._local = {k: v for k, v in self._local.items() if now - v[0] < WINDOW_SECONDS}
        return count + 1


def rate_limited(what: str, limit: int, field: str) -> RateLimited:
    """The 429 of a limit of `limit` `what` (plural: "requests with this API key") a minute,
    with Retry-After."""
    return RateLimited(
        f"{what}: at most {limit} a minute; try again later",
        field=field,
        details={"limit": limit, "window_seconds": WINDOW_SECONDS},
        headers={"Retry-After": str(WINDOW_SECONDS)},
    )
