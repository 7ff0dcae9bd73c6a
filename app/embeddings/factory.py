"""Build the configured embedder: from plain parameters, or from the deployment settings."""

from typing import Any, Literal

from app.embeddings.base import Embedder, EmbedderUnavailable
from app.embeddings.local import E5Embedder, UseEmbedder
from app.embeddings.openai import OpenAIEmbedder
from app.embeddings.settings import EmbeddingSettings

EmbedderKind = Literal["e5", "use", "openai", "none"]


def create_embedder(kind: EmbedderKind, **params: Any) -> Embedder | None:
    """The embedder for `kind`, or None for "none" (lexical recall only).

    `params` go to the constructor: `E5Embedder(name=, max_tokens=, max_chars=, passage_threads=,
    precision=, cache_dir=)`,
    `UseEmbedder(threads=, max_chars=)`, `OpenAIEmbedder(base_url=, model=, api_key=, dim=, ...)`.
    Raises `EmbedderUnavailable` when the provider cannot be built (missing extra, no base_url,
    unknown kind) and `TypeError` for parameters the provider does not take.
    """
    if kind == "none":
        return None
    if kind == "e5":
        return E5Embedder(**params)
    if kind == "use":
        return UseEmbedder(**params)
    if kind == "openai":
        params.setdefault("api_key", None)
        return OpenAIEmbedder(**params)
    raise EmbedderUnavailable(f"unknown embedder kind {kind!r}; expected e5, use, openai or none")


def embedder_from_settings(settings: EmbeddingSettings) -> Embedder | None:
    """The deployment's embedder, built once per process (API lifespan or worker start)."""
    embedder = _from_settings(settings)
    if embedder is not None:
        embedder.query_timeout_s = settings.query_timeout_seconds
    return embedder


def _from_settings(settings: EmbeddingSettings) -> Embedder | None:
    if settings.kind == "openai":
        return create_embedder(
            "openai",
            base_url=settings.openai_base_url,
            model=settings.openai_model,
            api_key=settings.openai_api_key,
            dim=settings.openai_dim,
            batch_size=settings.batch_size,
            timeout_s=settings.timeout_seconds,
        )
    if settings.kind == "e5":
        return create_embedder(
            "e5",
            passage_threads=settings.passage_threads,
            precision=settings.e5_precision,
            cache_dir=settings.e5_cache_dir,
        )
    return create_embedder(settings.kind)
