"""Redis (or Valkey, one server or a Redis Cluster) as a cache only: every read falls back to
Postgres when it is unreachable.

Keys are `<prefix>:v1:<kind>:{<tag>}<rest...>`. The braces are the key's hash tag: on a Redis
Cluster only the tag picks the slot, so every key of one session (tag `{<tenant>:<session id>}`),
and a versioned value with its `:floor`, live in one slot and the Lua scripts below never span
two. After an error the cache steps aside for
`retry_after_seconds`, so a dead Redis costs one timeout, not one per request; callers learn of the
bypass through `Cache.bypassed` and report the `cache_bypass` fallback.
"""

import json
import logging
import time
from typing import Any, TypeAlias

import redis.asyncio as redis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from app.core.config import CacheSettings

logger = logging.getLogger("contextd.cache")

SCHEMA_VERSION = "v1"

# What a cache call can raise: a cluster client's topology failures (no node reachable, a slot
# without a primary) are not `RedisError`s.
CACHE_ERRORS = (RedisError, RedisClusterException, OSError)

# Versioned values: a writer, after its commit, raises the key's floor to its row version and
# deletes the value; a reader stores what it read only if its version is not below the floor. So a
# reader that read the row before a write committed can never store that old copy afterwards.
_SET_IF_NOT_OLDER = """
local floor = redis.call('GET', KEYS[2])
if floor and tonumber(floor) > tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
return 1
"""
_RAISE_FLOOR_AND_DELETE = """
local floor = redis.call('GET', KEYS[2])
if (not floor) or tonumber(floor) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
end
redis.call('DEL', KEYS[1])
return 1
"""

# One command per counted event (a MULTI/EXEC pipeline is four): the count, and the window's
# expiry set by its first event.
_COUNT_IN_WINDOW = """
local count = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1], 'NX')
return count
"""


Client: TypeAlias = redis.Redis | redis.RedisCluster


def connect(url: str, settings: CacheSettings) -> Client:
    """A client of the server at `url`, or with `settings.cluster` of the Redis Cluster that
    `url` is one node of (the others are found from it, lazily, on the first command)."""
    timeout = settings.socket_timeout_seconds
    if settings.cluster:
        # One retry, at once: enough to follow a slot to a replica promoted in its primary's
        # place; the default (ten, with backoff) keeps a request seconds on a dead primary.
        others = [
            n.strip().rsplit(":", 1) for n in (settings.cluster_nodes or "").split(",") if n.strip()
        ]
        return redis.RedisCluster.from_url(
            url,
            startup_nodes=[ClusterNode(host, int(port)) for host, port in others],
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), retries=1),
        )
    return redis.Redis.from_url(
        url, socket_connect_timeout=timeout, socket_timeout=timeout, retry_on_timeout=False
    )


class Cache:
    def __init__(self, url: str | None, settings: CacheSettings) -> None:
        self._settings = settings
        self._client: Client | None = connect(url, settings) if url else None
        self._down_until = 0.0
        # A cluster client learns the topology and the command table on its first command, but
        # routes that command before it knows them: a keyed write may go to any node, a dead
        # one too. It is initialised on its own first, so every command is routed by its slot.
        self._topology_known = not isinstance(self._client, redis.RedisCluster)
        # Invalidations that could not reach Redis; replayed before the next successful use so a
        # write made during an outage never leaves an old value to be served after it.
        self._pending_deletes: set[str] = set()

    @property
    def client(self) -> Client | None:
        return self._client

    @property
    def bypassed(self) -> bool:
        """True while the cache is being skipped (unconfigured, or after a recent error)."""
        return self._client is None or time.monotonic() < self._down_until

    @property
    def prefix(self) -> str:
        """What every key of this cache starts with (then `:`)."""
        return f"{self._settings.key_prefix}:{SCHEMA_VERSION}"

    def key(self, kind: str, *parts: object) -> str:
        """`<prefix>:v1:<kind>:{<parts>}`: the parts (what the value is about) are the tag."""
        return f"{self.prefix}:{kind}:{{{':'.join(map(str, parts))}}}"

    def session_tag(self, tenant_id: object, session_id: str) -> str:
        """`{<tenant>:<session>}`, the hash tag of every key about one session: the session as
        its clients name it, the one name its cached view is looked up by before any row is read.
        (Redis hashes from the first `{` to the next `}`; a `}` in the session id only shortens
        the tag, the same way in each of the session's keys.)"""
        return f"{{{tenant_id}:{session_id}}}"

    def session_key(self, kind: str, tenant_id: object, session_id: str, *parts: object) -> str:
        """A key about one session, in its slot: `<prefix>:v1:<kind>:{<tenant>:<session>}...`
        (`key(kind, tenant_id, session_id)` is the same key)."""
        tagged = f"{self.prefix}:{kind}:{self.session_tag(tenant_id, session_id)}"
        return ":".join([tagged, *map(str, parts)])

    async def _available(self) -> Client | None:
        if self.bypassed:
            return None
        assert self._client is not None
        if not self._topology_known:
            assert isinstance(self._client, redis.RedisCluster)
            try:
                await self._client.initialize()
            except CACHE_ERRORS as exc:
                self._failed(exc)
                return None
            self._topology_known = True
        if self._pending_deletes:
            try:
                await self._client.delete(*self._pending_deletes)
                self._pending_deletes.clear()
            except CACHE_ERRORS as exc:
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
        except CACHE_ERRORS as exc:
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
        except CACHE_ERRORS as exc:
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
        except CACHE_ERRORS as exc:
            self._pending_deletes.update(keys)
            self._failed(exc)

    async def set_versioned(self, key: str, value: Any, version: int) -> None:
        """Store `value` read at row `version`, unless a newer write has been committed since."""
        client = await self._available()
        if client is None:
            return
        try:
            await client.eval(
                _SET_IF_NOT_OLDER,
                2,
                key,
                f"{key}:floor",
                json.dumps(value, default=str),
                version,
                self._settings.ttl_seconds,
            )
        except CACHE_ERRORS as exc:
            self._failed(exc)

    async def invalidate_versioned(self, key: str, version: int) -> None:
        """After committing row `version`: drop the value and refuse older copies from now on.

        When Redis cannot be reached the key is queued as an ordinary delete; the floor's TTL
        outlives the value's, so no copy cached before the outage survives it either.
        """
        client = await self._available()
        if client is None:
            self._pending_deletes.add(key)
            return
        try:
            await client.eval(
                _RAISE_FLOOR_AND_DELETE,
                2,
                key,
                f"{key}:floor",
                version,
                self._settings.ttl_seconds * 2,
            )
        except CACHE_ERRORS as exc:
            self._pending_deletes.add(key)
            self._failed(exc)

    async def incr_window(self, key: str, window_seconds: int) -> int | None:
        """Count an event in a fixed window; None when Redis cannot answer (caller falls back)."""
        client = await self._available()
        if client is None:
            return None
        try:
            count = await client.eval(_COUNT_IN_WINDOW, 1, key, window_seconds)
            return int(count)
        except CACHE_ERRORS as exc:
            self._failed(exc)
            return None

    async def ping(self) -> bool:
        if self._client is None:
            return False
        try:
            if isinstance(self._client, redis.RedisCluster):  # every primary, not any one node
                return bool(await self._client.ping(target_nodes=redis.RedisCluster.PRIMARIES))
            return bool(await self._client.ping())
        except CACHE_ERRORS:
            return False

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
