"""The query adapter: a question's embedding moved toward the statements that answer it, before
the chunk vector arm searches with it.

e5 places a question near other questions: every question shares one direction (their mean),
and the chunks closest to that direction are the generic ones (greetings, small talk), which
the vector arm then ranks above the turn that answers. A linear map fitted on LoCoMo's tune
split (conversations 0-3: each question's evidence chunks against the other chunks of its
conversation) came out nearly rank one (94 % of its energy): x + scale · (x · toward_from) ·
toward_to, with `toward_from` the negated mean question direction and `toward_to` near the
mean chunk direction. That is what `query_adapter.json` holds (`benchmarks.fit_query_adapter`
writes it). Chunks only: remembered items are one-sentence statements about the user, and
on MADial the same map lowered their recall (docs/BENCHMARKS.md, tuning decisions: "Query adapter").

Pure: no I/O beyond reading the packaged file once.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

ADAPTER_FILE = "query_adapter.json"


@dataclass(frozen=True, slots=True)
class QueryAdapter:
    """x ↦ unit(x + scale · (x · toward_from) · toward_to), for an embedding x."""

    model: str  # the embedder whose vectors it was fitted on
    scale: float
    toward_from: np.ndarray  # float32, unit
    toward_to: np.ndarray  # float32, unit

    def apply(self, vector: Sequence[float]) -> Sequence[float]:
        x = np.asarray(vector, dtype=np.float32)
        moved = x + self.scale * float(x @ self.toward_from) * self.toward_to
        norm = float(np.linalg.norm(moved))
        return vector if norm == 0.0 else (moved / norm).tolist()


def adapter_from_json(text: str) -> QueryAdapter:
    data = json.loads(text)
    return QueryAdapter(
        model=str(data["model"]),
        scale=float(data["scale"]),
        toward_from=np.asarray(data["toward_from"], dtype=np.float32),
        toward_to=np.asarray(data["toward_to"], dtype=np.float32),
    )


@cache
def packaged_adapter() -> QueryAdapter:
    """The adapter shipped with the package (read once per process)."""
    return adapter_from_json(resources.files(__package__).joinpath(ADAPTER_FILE).read_text())


def chunk_query_vector(vector: Sequence[float], model: str, enabled: bool) -> Sequence[float]:
    """The vector the chunk arm searches with: adapted when `enabled` and the packaged adapter
    was fitted on `model`'s vectors (another embedder's space has other directions)."""
    if not enabled:
        return vector
    adapter = packaged_adapter()
    if adapter.model != model or len(vector) != adapter.toward_to.shape[0]:
        return vector
    return adapter.apply(vector)
