"""Optional HTTP cross-encoder reranker (TEI, Jina or Cohere wire style).

`HttpReranker.rerank(query, documents)` returns one relevance score per document, in input order.
It makes one request and never retries: it sits on the read path, and when it fails the recall chain
simply keeps the fused order. Every failure (transport, HTTP status, malformed or incomplete
response) raises `RerankUnavailable`.

- TEI:           `POST {url}/rerank` `{"query", "texts", "truncate"}` → `[{"index", "score"}]`
- Jina / Cohere: `POST {url}/v1/rerank` `{"model", "query", "documents", "top_n"}`
                 → `{"results": [{"index", "relevance_score"}]}`
"""

from collections.abc import Sequence
from typing import Any, Literal

import httpx

RerankStyle = Literal["tei", "jina", "cohere"]
DEFAULT_MAX_CHARS = 4000


class RerankUnavailable(Exception):
    """The reranker could not score the documents; callers keep the fused order."""


def rerank_url(url: str, style: RerankStyle) -> str:
    base = url.rstrip("/")
    if style == "tei":
        return f"{base}/rerank"
    return f"{base}/rerank" if base.endswith("/v1") else f"{base}/v1/rerank"


def _scores_by_index(pairs: Any, count: int, score_key: str) -> list[float]:
    if not isinstance(pairs, list):
        raise RerankUnavailable("reranker response is not a list of results")
    scores: dict[int, float] = {}
    for item in pairs:
        if not isinstance(item, dict):
            raise RerankUnavailable("reranker result is not an object")
        index, score = item.get("index"), item.get(score_key)
        if not isinstance(index, int) or not 0 <= index < count or index in scores:
            raise RerankUnavailable(f"reranker result has a bad index {index!r}")
        if not isinstance(score, int | float) or isinstance(score, bool):
            raise RerankUnavailable(f"reranker result has no numeric {score_key!r}")
        scores[index] = float(score)
    if len(scores) != count:
        raise RerankUnavailable(f"reranker scored {len(scores)} of {count} documents")
    return [scores[i] for i in range(count)]


class HttpReranker:
    """Scores (query, document) pairs with a remote cross-encoder; owns its client unless given."""

    def __init__(
        self,
        url: str,
        style: RerankStyle,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 5.0,
        *,
        max_chars: int = DEFAULT_MAX_CHARS,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not url:
            raise RerankUnavailable("the HTTP reranker needs a url")
        if style not in ("tei", "jina", "cohere"):
            raise RerankUnavailable(f"unknown rerank style {style!r}; expected tei, jina or cohere")
        if style != "tei" and not model:
            raise RerankUnavailable(f"the {style} rerank API needs a model name")
        if timeout_s <= 0 or max_chars < 1:
            raise ValueError("timeout_s and max_chars must be positive")
        self.url = rerank_url(url, style)
        self.style: RerankStyle = style
        self.model = model
        self.max_chars = max_chars
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s)
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient()

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def rerank(self, query: str, documents: Sequence[str]) -> list[float]:
        """One score per document, in input order (higher is more relevant)."""
        if isinstance(documents, str):
            raise TypeError("documents must be a sequence of strings, not a str")
        docs = [doc[: self.max_chars] for doc in documents]
        if not docs:
            return []
        payload = await self._post(self._body(query, docs))
        if self.style == "tei":
            return _scores_by_index(payload, len(docs), "score")
        results = payload.get("results") if isinstance(payload, dict) else None
        return _scores_by_index(results, len(docs), "relevance_score")

    def _body(self, query: str, docs: list[str]) -> dict[str, Any]:
        if self.style == "tei":
            return {"query": query, "texts": docs, "truncate": True}
        return {"model": self.model, "query": query, "documents": docs, "top_n": len(docs)}

    async def _post(self, body: dict[str, Any]) -> Any:
        try:
            response = await self._client.post(
                self.url, json=body, headers=self._headers, timeout=self._timeout
            )
        except httpx.HTTPError as exc:
            raise RerankUnavailable(f"cannot reach reranker at {self.url}: {exc!r}") from exc
        if response.status_code != 200:
            raise RerankUnavailable(
                f"reranker {self.url} answered HTTP {response.status_code}: {response.text[:200]}"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise RerankUnavailable(f"reranker returned invalid JSON: {exc}") from exc
