"""The vector arm's exact scan in process: a session's chunk vectors, kept per process.

Below `recall.vector_index_min_chunks` a session's vector arm is an exact scan of its vectors.
In PostgreSQL that statement took ~2 ms at 1,000 chunks, after the query's embedding and before
anything else could go on, and grew with the table around the session (its rows are read through
the session index). Here the same scan is one matrix-vector product (~0.05 ms at 1,000 chunks of
384 dimensions). A chunk's vector of a given model never changes once written, so the vectors
this process read are valid in any later build; which chunks are active comes from the
session's `chunks_version` (the BM25 index of that version, `app.recall.session_chunks`).
"""

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

Vector = np.ndarray  # float32, one dimension


@dataclass(frozen=True)
class ChunkVectors:
    """The vectors of `model` of some of a session's chunks, as unit rows of one matrix."""

    model: str
    ids: tuple[str, ...] = ()
    units: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    held: frozenset[str] = frozenset()

    @property
    def nbytes(self) -> int:
        return int(self.units.nbytes)

    def with_vectors(self, vectors: Mapping[str, Vector]) -> "ChunkVectors":
        """These vectors and `vectors` (those not held yet)."""
        new = [cid for cid in vectors if cid not in self.held]
        if not new:
            return self
        rows = np.stack([vectors[cid] for cid in new]).astype(np.float32, copy=False)
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        # A zero vector has no direction: it stays zero and is as far as can be from any query.
        rows = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)
        units = rows if not self.ids else np.concatenate([self.units, rows])
        return ChunkVectors(self.model, (*self.ids, *new), units, self.held | set(new))

    def of(self, ids: Collection[str]) -> dict[str, Vector]:
        """The unit vectors of those of `ids` held here."""
        wanted = set(ids) & self.held
        return {cid: self.units[i] for i, cid in enumerate(self.ids) if cid in wanted}

    def kept_for(self, active: Collection[str]) -> "ChunkVectors":
        """The vectors of the `active` chunks only (after chunks went away)."""
        rows = [i for i, cid in enumerate(self.ids) if cid in active]
        if len(rows) == len(self.ids):
            return self
        ids = tuple(self.ids[i] for i in rows)
        return ChunkVectors(self.model, ids, self.units[rows], frozenset(ids))

    def nearest(self, query: Sequence[float], limit: int) -> dict[str, float]:
        """Cosine similarity of the `limit` chunks closest to `query`, best first (ties by chunk
        id, so that every process answers alike)."""
        if not self.ids or limit <= 0:
            return {}
        q = np.asarray(query, dtype=np.float32)
        norm = float(np.linalg.norm(q))
        if norm == 0.0:
            return {}
        similarities = self.units @ (q / norm)
        k = min(limit, len(self.ids))
        best = (
            np.argpartition(-similarities, k - 1)[:k] if k < len(self.ids) else range(len(self.ids))
        )
        order = sorted(best, key=lambda i: (-similarities[i], self.ids[i]))
        return {self.ids[i]: float(similarities[i]) for i in order}
