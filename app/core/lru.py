"""Per-process LRUs: `VersionedLRU`, one value per owner keyed by the owner's version, and
`LRU`, values by a key that never goes stale (a text's vector).

A value is looked up as `(owner, version)`; storing a newer version of an owner drops the older
ones. Used for the per-session BM25 indexes of recall, keyed by `sessions.chunks_version`, which
every change of the session's active chunks bumps in the same transaction (offload, forget,
re-chunk, delete), also when the chunk count stays the same — so a cached value is never stale,
in this process or any other.

Every operation is O(1): an owner's kept version is indexed (a build asks for its session's
latest value; a scan of the LRU for it cost ~10 µs a build with 200 sessions kept).
"""

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
Key = tuple[str, int]  # (owner, version)


class LRU(Generic[K, V]):
    """At most `max_items` values, the least recently used dropped first."""

    def __init__(self, max_items: int) -> None:
        self._max = max_items
        self._values: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        if self._max <= 0:
            return
        self._values[key] = value
        self._values.move_to_end(key)
        while len(self._values) > self._max:
            self._values.popitem(last=False)


class VersionedLRU(Generic[V]):
    def __init__(self, max_owners: int) -> None:
        self._max = max_owners
        self._values: OrderedDict[Key, V] = OrderedDict()
        self._versions: dict[str, int] = {}  # owner -> the version kept for it

    def get(self, key: Key) -> V | None:
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def latest(self, owner: str) -> tuple[int, V] | None:
        """The version and value kept for `owner`, whatever its version (a value to update
        rather than rebuild)."""
        version = self._versions.get(owner)
        return None if version is None else (version, self._values[(owner, version)])

    def put(self, key: Key, value: V) -> None:
        if self._max <= 0:
            return
        owner, version = key
        old = self._versions.get(owner)
        if old is not None:
            del self._values[(owner, old)]
        self._values[key] = value
        self._versions[owner] = version
        while len(self._values) > self._max:
            (evicted, _), _ = self._values.popitem(last=False)
            del self._versions[evicted]
