"""Per-process cache of BM25 indexes, one per session, keyed by the session's chunk state.

The key is `(session id, sessions.chunks_version)`, which every change of the session's active
chunks bumps in the same transaction (offload, forget, re-chunk, delete) — also when the chunk
count stays the same — so a cached index is never stale; building one from stored term counts
takes ~100 ms for 5,000 chunks, scoring a query well under a millisecond.
"""

from collections import OrderedDict

from app.recall.bm25 import BM25Index

IndexKey = tuple[str, int]


class LexicalIndexCache:
    def __init__(self, max_sessions: int) -> None:
        self._max = max_sessions
        self._indexes: OrderedDict[IndexKey, BM25Index] = OrderedDict()

    def get(self, key: IndexKey) -> BM25Index | None:
        index = self._indexes.get(key)
        if index is not None:
            self._indexes.move_to_end(key)
        return index

    def put(self, key: IndexKey, index: BM25Index) -> None:
        if self._max <= 0:
            return
        # One entry per session: drop the session's older states first.
        for old in [k for k in self._indexes if k[0] == key[0]]:
            del self._indexes[old]
        self._indexes[key] = index
        while len(self._indexes) > self._max:
            self._indexes.popitem(last=False)
