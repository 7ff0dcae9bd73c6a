"""What this process keeps of a session's chunks from build to build, the one per-process state
of recall (`SessionChunks`, in `AppContext.lexical_indexes`): their BM25 index, the turns of the
chunks shown, the rows read, their duplicate keys and their vectors."""

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.context import AppContext
from app.core.db import release
from app.domain.stem import by_stem
from app.recall.bm25 import BM25Index
from app.recall.rerank import text_key
from app.recall.vectors import ChunkVectors
from app.store import chunks as chunks_store
from app.store.models import Session


def stemmed(
    stats: Sequence[tuple[str, Mapping[str, int]]],
) -> list[tuple[str, dict[str, int]]]:
    return [(cid, by_stem(counts)) for cid, counts in stats]


# The chunks of a session this process keeps what recall read of (`SessionChunks`): a shown
# chunk's rendered turns, a vector candidate's row. Each is read once per process, not on every
# build that meets the chunk again.
CHUNKS_KEPT = 1024

ChunkLines = tuple[tuple[int, str], ...]  # a chunk's live turns as (seq, rendered line), in order


@dataclass
class SessionChunks:
    """What this process keeps of a session's active chunks at one `chunks_version`: their BM25
    index; for the chunks recall has shown, their turns as rendered lines; for the chunks it has
    read, their rows as recall shows them (`ShownChunk`) and their texts' duplicate keys
    (`rerank.text_key`). At most `CHUNKS_KEPT` of each, least recently used dropped first.

    An active chunk's row and live turns never change: forgetting any of its turns tombstones
    the chunk and re-chunks the rest under new ids (`app.erasure.service`), an offload writes a
    chunk and marks its turns in one transaction, and only its vector is written later. So kept
    lines and rows are those a read would return for every chunk the build found active (the
    vector arm returns active chunks only: its statement reads active ones, the scan in process
    holds the chunks of this state's index), in any process; and a
    forgotten chunk's lines and row are dropped at the session's next build in this process (a
    new `chunks_version`, whose index no longer holds the chunk)."""

    index: BM25Index
    lines: dict[str, ChunkLines] = field(default_factory=dict)
    rows: dict[str, chunks_store.ShownChunk] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    vectors: ChunkVectors | None = None  # when the session's vector arm scans in process

    def carried_to(self, index: BM25Index) -> "SessionChunks":
        """This state's lines, rows, keys and vectors for the chunks `index` (of a later
        version) still holds."""
        active = set(index.ids)
        return SessionChunks(
            index,
            {c: t for c, t in self.lines.items() if c in active},
            {c: r for c, r in self.rows.items() if c in active},
            {c: k for c, k in self.keys.items() if c in active},
            None if self.vectors is None else self.vectors.kept_for(active),
        )

    def unvectored(self, model: str) -> list[str]:
        """The active chunks whose vector of `model` this process does not hold."""
        held = self.vectors
        if held is None or held.model != model:
            return list(self.index.ids)
        if len(held.ids) == len(self.index.ids):  # held ones are active ones
            return []
        return [cid for cid in self.index.ids if cid not in held.held]

    def add_vectors(self, model: str, vectors: Mapping[str, np.ndarray]) -> ChunkVectors:
        held = self.vectors
        if held is None or held.model != model:
            held = ChunkVectors(model)
        self.vectors = held.with_vectors(vectors)
        return self.vectors

    def keep(self, chunk_id: str, lines: ChunkLines) -> None:
        _kept(self.lines, chunk_id, lines)

    def shown(self, chunk_id: str) -> ChunkLines | None:
        return _used(self.lines, chunk_id)

    def keep_rows(self, rows: Iterable[chunks_store.ShownChunk]) -> None:
        """Keep the active ones of `rows` (read by this build)."""
        for row in rows:
            if row.status == "active":
                _kept(self.rows, row.id, row)

    def row(self, chunk_id: str) -> chunks_store.ShownChunk | None:
        return _used(self.rows, chunk_id)

    def text_key(self, chunk_id: str, text: str) -> str:
        """`rerank.text_key` of an active chunk's `text`."""
        key = _used(self.keys, chunk_id)
        if key is None:
            key = text_key(text)
            _kept(self.keys, chunk_id, key)
        return key


Kept = TypeVar("Kept")


def _kept(kept: dict[str, Kept], chunk_id: str, value: Kept) -> None:
    kept.pop(chunk_id, None)
    kept[chunk_id] = value  # most recently used last
    while len(kept) > CHUNKS_KEPT:
        del kept[next(iter(kept))]


def _used(kept: dict[str, Kept], chunk_id: str) -> Kept | None:
    value = kept.pop(chunk_id, None)
    if value is not None:
        kept[chunk_id] = value  # most recently used last
    return value


async def kept_chunks(db: AsyncSession, context: AppContext, session: Session) -> SessionChunks:
    """The session's BM25 index over its active chunks, their terms merged under their stems
    (`app.domain.stem`), and its shown chunks' lines, kept per process per chunk state. After the
    chunks changed, the process's index of an earlier state is extended by the chunks added
    since, when none of its chunks went away (an offload only adds); otherwise it is built anew.
    Built off the event loop and outside the transaction: a session's history can be large."""
    key = (str(session.id), session.chunks_version)
    cached = context.lexical_indexes.get(key)
    if isinstance(cached, SessionChunks):
        return cached
    latest = context.lexical_indexes.latest(key[0])
    earlier = latest[1] if latest is not None and latest[0] < key[1] else None
    state: SessionChunks | None = None
    if isinstance(earlier, SessionChunks):
        active = {
            str(cid)
            for cid in await chunks_store.active_chunk_ids(db, session.tenant_id, session.id)
        }
        known = set(earlier.index.ids)
        if known <= active:
            added = await chunks_store.term_stats(
                db, session.tenant_id, session.id, sorted(active - known)
            )
            await release(db)
            index = await asyncio.to_thread(earlier.index.extended, stemmed(added))
            state = SessionChunks(index, earlier.lines, earlier.rows, earlier.keys, earlier.vectors)
    if state is None:
        stats = await chunks_store.term_stats(db, session.tenant_id, session.id)
        await release(db)
        index = await asyncio.to_thread(lambda: BM25Index.from_term_counts(stemmed(stats)))
        state = (
            earlier.carried_to(index)
            if isinstance(earlier, SessionChunks)
            else SessionChunks(index)
        )
    context.lexical_indexes.put(key, state)
    return state
