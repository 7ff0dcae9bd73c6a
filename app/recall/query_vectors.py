"""The query's own network calls: its embedding (cached, behind the embedder's circuit breaker,
shared by the parts of one request: `QueryVectors`) and the optional LLM rewrite."""

import asyncio
import hashlib
import logging
from collections.abc import Sequence

from app.core.context import AppContext
from app.embeddings.base import EmbedderBusy, EmbedderTimeout, EmbedderUnavailable, l2_normalise
from app.recall.llm_rewrite import QueryRewriteUnavailable, llm_rewrite
from app.recall.query import own_words_suffice, query_views

logger = logging.getLogger("contextd.recall")


async def _query_vector(
    context: AppContext,
    query: str,
    fallbacks: list[str],
    timeout_s: float | None = None,
    unstored: list[tuple[str, list[float]]] | None = None,
) -> list[float] | None:
    """The query's embedding within `timeout_s` (default: the embedder's query budget), or
    None: lexical recall only, flagged `vector_unavailable` (with `vector_timeout` when the
    budget ran out). After repeated failures or timeouts (not counting those spent queued while
    the embedder answered other queries: `EmbedderBusy`) the circuit breaker skips the embedder
    for a while (`embedder_circuit_open` too), so a hanging embedder costs each build nothing
    rather than its whole budget. A new vector is stored in the cache before it is returned, or
    added to `unstored` for the caller to store later (`QueryVectors.store`)."""
    embedder = context.embedder
    if embedder is None:
        fallbacks.append("vector_unavailable")
        return None
    views = query_views(query)
    digest = hashlib.sha256("\n\x00".join(views).encode()).hexdigest()
    key = context.cache.key("qemb", embedder.name, digest)
    cached = await context.cache.get_json(key)
    if cached is not None:
        return list(cached)
    breaker = context.query_embedder
    if not breaker.allow():
        fallbacks.append("vector_unavailable")
        fallbacks.append("embedder_circuit_open")
        return None
    try:
        embedded = await embedder.embed_queries(views, timeout_s=timeout_s)
        vector: list[float] = l2_normalise(embedded.mean(axis=0, keepdims=True))[0].tolist()
    except asyncio.CancelledError:
        # The build stopped waiting (its other arms failed, or the client left): no verdict on
        # the embedder, and a half-open trial call may be made again.
        breaker.inconclusive()
        raise
    except EmbedderUnavailable as exc:
        if isinstance(exc, EmbedderBusy):
            breaker.inconclusive()  # it answered other queries meanwhile: working, not failing
        else:
            breaker.failed()
        logger.warning("query embedding unavailable, lexical only: %s", type(exc).__name__)
        fallbacks.append("vector_unavailable")
        if isinstance(exc, EmbedderTimeout):
            fallbacks.append("vector_timeout")
        return None
    breaker.succeeded()
    if unstored is None:
        await context.cache.set_json(
            key, vector, ttl=context.settings.cache.query_vector_ttl_seconds
        )
    else:
        unstored.append((key, vector))
    return vector


class QueryVectors:
    """The query embeddings of one request, one per text: the first part of the request that
    needs a text's vector (or the request itself, as soon as it knows the text) starts its
    embedding, and every part awaits that one, so a text is embedded once per request and can
    encode while the event loop does other work. Each awaiting part gets the embedding's
    fallbacks in its own list. The owner `cancel`s what is still running when it is done.

    A new vector is stored in the cache by `store`, which the part that searches with it runs
    beside its search and ranking: the store's JSON and round trip were ~1.3 ms of a 1-client
    build's critical path between the embedding and the vector search."""

    def __init__(self, context: AppContext, timeout_s: float | None = None) -> None:
        self._context = context
        self._timeout_s = timeout_s
        self._running: dict[str, asyncio.Task[tuple[list[float] | None, list[str]]]] = {}
        self._unstored: list[tuple[str, list[float]]] = []

    def start(self, text: str) -> None:
        if text not in self._running:
            self._running[text] = asyncio.create_task(self._embed(text))

    async def vector(self, text: str, fallbacks: list[str]) -> list[float] | None:
        self.start(text)
        vector, flags = await self._running[text]
        fallbacks.extend(flags)
        return vector

    def cancel(self) -> None:
        for task in self._running.values():
            task.cancel()

    async def store(self) -> None:
        """Store in the cache the vectors embedded since the last call."""
        while self._unstored:
            key, vector = self._unstored.pop()
            await self._context.cache.set_json(
                key, vector, ttl=self._context.settings.cache.query_vector_ttl_seconds
            )

    async def _embed(self, text: str) -> tuple[list[float] | None, list[str]]:
        flags: list[str] = []
        vector = await _query_vector(self._context, text, flags, self._timeout_s, self._unstored)
        return vector, flags


def early_query_text(context: AppContext, query: str | None) -> str | None:
    """The text recall and the user's items will embed for `query`, when it is known before
    either runs (the query itself when it has enough own terms and no LLM rewrite replaces it;
    see `embedding_query`); None: each finds its text later."""
    if (
        context.embedder is None
        or not query
        or context.settings.recall.rewrite_llm_base_url
        or not own_words_suffice(query)
    ):
        return None
    return query


async def rewrite_with_llm(
    context: AppContext, query: str, recent_turns: Sequence[str], fallbacks: list[str]
) -> str | None:
    """The LLM rewrite of `query` when configured; its failure is flagged and yields None."""
    settings = context.settings.recall
    if not settings.rewrite_llm_base_url:
        return None
    try:
        return await llm_rewrite(
            context.http,
            settings.rewrite_llm_base_url,
            settings.rewrite_llm_model,
            settings.rewrite_llm_api_key,
            query,
            recent_turns,
            settings.rewrite_llm_timeout_seconds,
        )
    except QueryRewriteUnavailable as exc:
        logger.warning("LLM query rewrite unavailable, keeping the rule rewrite: %s", exc)
        fallbacks.append("rewrite_unavailable")
        return None
