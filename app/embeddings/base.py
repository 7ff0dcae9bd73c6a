"""The one interface every embedding provider implements.

An `Embedder` turns texts into L2-normalised float32 row vectors of a fixed size (`dim`). Queries
and passages are embedded separately because asymmetric models (e5) prefix them differently.
Every input is cut to `max_chars` before encoding: encoding time grows linearly with input
length, and contextd's chunks are far shorter than the cap, so it only bounds pathological inputs.

Any provider failure (model missing, server down, bad response) surfaces as `EmbedderUnavailable`,
which the recall chain turns into the `vector_unavailable` fallback. A query embedding is bounded
in time (`query_timeout_s`, queueing included): past it `EmbedderTimeout`, and the build goes on
lexically (`vector_timeout`). A timeout during which the embedder answered other calls of the
same kind is `EmbedderBusy`: the provider works, this call only queued behind others (a local
encoder under concurrent queries), which a circuit breaker must not count as a failure.
"""

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

DEFAULT_MAX_CHARS = 2048
# What a text is embedded as; the encoders' lanes (and their warm-up) are per kind.
EmbeddingKind = Literal["query", "passage"]


class EmbedderUnavailable(Exception):
    """The embedding provider cannot produce vectors right now (or is misconfigured)."""


class EmbedderTimeout(EmbedderUnavailable):
    """The vectors of a query were not ready within the embedder's `query_timeout_s`."""


class EmbedderBusy(EmbedderTimeout):
    """A timeout while the embedder kept answering other calls of the same kind: it is healthy
    but queued (a local encoder serving concurrent queries batch after batch), not hung."""


def prepare_text(text: str, max_chars: int) -> str:
    """`text` made safe to encode: cut to `max_chars` code points, NUL → space, lone UTF-16
    surrogates (valid in JSON, not in UTF-8) → U+FFFD, so one odd input never fails a batch."""
    head = text if len(text) <= max_chars else text[:max_chars]
    head = head.replace("\x00", " ")
    try:
        head.encode("utf-8")
    except UnicodeEncodeError:
        head = head.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return head


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length as float32; an all-zero row stays zero."""
    matrix = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms > 1e-12, norms, 1.0)


def vector_literal(vector: Sequence[float]) -> str:
    """A vector as pgvector's text form, `[x1,x2,...]`, for a bound `CAST(:v AS vector(n))`."""
    return "[" + ",".join(f"{float(x):.7g}" for x in vector) + "]"


class Embedder(ABC):
    """Async text → vector interface; see the module docstring for the contract."""

    name: str
    dim: int
    max_chars: int = DEFAULT_MAX_CHARS
    # Called with ("query" | "passage", seconds) after every encode, failed ones included; the
    # owner of the embedder (AppContext) sets it to feed its metrics. None: nobody is listening.
    observer: Callable[[str, float], None] | None = None
    # The longest a query embedding may take, waiting for the encoder included (None: no bound).
    query_timeout_s: float | None = None
    # Calls answered so far, per kind ("query", "passage"): a timed-out call that saw this grow
    # while it waited was queued behind working calls (`EmbedderBusy`), not failed.
    # None until the instance's first call.
    answered: dict[str, int] | None = None

    async def embed_queries(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> np.ndarray:
        """`(len(texts), dim)` float32, L2-normalised, for search queries. Raises
        `EmbedderTimeout` after `timeout_s` seconds (default `query_timeout_s`); an encoding
        still queued then is dropped, one already running finishes unused."""
        limit = self.query_timeout_s if timeout_s is None else timeout_s
        return await self._embed(texts, query=True, timeout=limit)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """`(len(texts), dim)` float32, L2-normalised, for stored documents (chunks, memories)."""
        return await self._embed(texts, query=False)

    async def aclose(self) -> None:  # noqa: B027 - optional hook; most providers hold nothing
        """Release what the provider holds (HTTP connections); the default holds nothing."""

    @abstractmethod
    async def _encode(self, texts: list[str], *, query: bool) -> np.ndarray:
        """Provider-specific encoding of already capped, non-empty `texts`: `(n, dim)` floats."""

    async def _embed(
        self, texts: Sequence[str], *, query: bool, timeout: float | None = None
    ) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed_queries/embed_passages take a sequence of strings, not a str")
        items = [prepare_text(text, self.max_chars) for text in texts]
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        kind = "query" if query else "passage"
        answered = self.answered = self.answered or {"query": 0, "passage": 0}
        answered_before = answered[kind]
        started = time.perf_counter()
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                raw = await self._encode(items, query=query)
        except EmbedderUnavailable:
            raise
        except Exception as exc:  # any provider failure degrades recall, never crashes it
            if deadline.expired():
                busy = answered[kind] > answered_before
                raise (EmbedderBusy if busy else EmbedderTimeout)(
                    f"embedder {self.name!r} gave no vectors within {timeout}s"
                    + (" (busy answering other calls)" if busy else "")
                ) from exc
            raise EmbedderUnavailable(f"embedder {self.name!r} failed: {exc!r}") from exc
        finally:
            if self.observer is not None:
                self.observer(kind, time.perf_counter() - started)
        matrix = np.asarray(raw, dtype=np.float32)
        if matrix.shape != (len(items), self.dim):
            raise EmbedderUnavailable(
                f"embedder {self.name!r} returned shape {matrix.shape}, "
                f"expected ({len(items)}, {self.dim})"
            )
        if not np.isfinite(matrix).all():
            raise EmbedderUnavailable(f"embedder {self.name!r} returned non-finite values")
        answered[kind] += 1
        return l2_normalise(matrix)
