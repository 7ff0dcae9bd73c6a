"""A query embedding whose build stops waiting for it (recall's other arms failed while it ran, or
the client left) gives the embedder's breaker no verdict: the half-open trial it was is free
again, so recall does not stay lexical for good (a real loopback embeddings server)."""

import asyncio
import threading
import uuid
from typing import Any

from app.core.config import Settings
from app.core.context import AppContext
from app.recall.query_vectors import _query_vector
from tests.support.loopback import loopback_server

DIM = 8


async def test_a_cancelled_trial_embedding_frees_the_half_open_breaker(settings: Settings) -> None:
    arrived = threading.Event()
    release = threading.Event()

    def embeddings(method: str, path: str, body: Any) -> tuple[int, Any]:
        arrived.set()
        release.wait(60)
        vectors = [[1.0] * DIM for _ in body["input"]]
        return 200, {"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)]}

    with loopback_server(embeddings) as server:
        served = settings.model_copy(
            update={
                "embedding": settings.embedding.model_copy(
                    update={"kind": "openai", "openai_base_url": server.url, "openai_dim": DIM}
                ),
                "recall": settings.recall.model_copy(
                    update={"embedder_breaker_failures": 1, "embedder_breaker_cooldown_seconds": 0}
                ),
            }
        )
        context = AppContext.create(served)
        try:
            await context.start_embedder()  # an HTTP embedder: no warm-up request
            breaker = context.query_embedder
            breaker.failed()  # open; the cooldown (0 s) is over at once: the next call is a trial
            fallbacks: list[str] = []
            trial = asyncio.create_task(
                _query_vector(context, f"train to Lyon {uuid.uuid4()}", fallbacks, 60)
            )
            assert await asyncio.to_thread(arrived.wait, 60)
            assert not breaker.allow()  # the trial is in flight: no second one
            trial.cancel()
            await asyncio.wait([trial])
            assert trial.cancelled()
            release.set()
            assert breaker.allow()  # the trial is free again
            assert fallbacks == []
        finally:
            release.set()
            await context.aclose()
