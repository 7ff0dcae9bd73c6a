"""A per-process LRU of one value per owner, keyed by the owner's version.

A value is looked up as `(owner, version)`; storing a newer version of an owner drops the older
ones. Used for the per-session BM25 indexes of recall, keyed by `sessions.chunks_version`, which
every change of the session's active chunks bumps in the same transaction (offload, forget,
re-chunk, delete), also when the chunk count stays the same — so a cached value is never stale,
in this process or any other.
"""

from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")
Key = tuple[str, int]  # (owner, version)


class VersionedLRU(Generic[V]):
    def __init__(self, max_owners: int) -> None:
        self._max = max_owners
        self._values: OrderedDict[Key, V] = OrderedDict()

    def get(self, key: Key) -> V | None:
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def latest(self, owner: str) -> tuple[int, V] | None:
        """The version and value kept for `owner`, whatever its version (a value to update
        rather than rebuild)."""
        for (found, version), value in self._values.items():
            if found == owner:
                return version, value
        return None

    def put(self, key: Key, value: V) -> None:
        if self._max <= 0:
            return
        for old in [k for k in self._values if k[0] == key[0]]:
            del self._values[old]
        self._values[key] = value
        while len(self._values) > self._max:
            self._values.popitem(last=False)
