"""The memory tool's `recall` waits for its query embedding up to its own budget
(`memory.recall_query_timeout_seconds`), longer than build-prompt's
(`embedding.query_timeout_seconds`); past it, it goes on lexically like a build."""

import threading
import time
from typing import Any

import httpx

from app.core.config import Settings
from tests.support.loopback import loopback_server, with_openai_embedder
from tests.support.server import run_server

SLOW = "which order number did I give you for the refund?"  # answered after 0.8 s
HUNG = "which refund order number did I mention?"  # answered only when the test ends
SLOW_SECONDS = 0.8  # the embedding API's latency for SLOW: past the build budget, within recall's


async def test_recall_waits_for_its_query_embedding_longer_than_a_build(
    settings: Settings, api_key: str
) -> None:
    release = threading.Event()

    def embeddings(method: str, path: str, body: Any) -> tuple[int, Any]:
        if body["input"] == [SLOW]:
            time.sleep(SLOW_SECONDS)  # a slow embedding API, not a synchronisation
        if body["input"] == [HUNG]:
            release.wait(60)
        vectors = [{"index": i, "embedding": [1.0] * 8} for i in range(len(body["input"]))]
        return 200, {"data": vectors}

    with loopback_server(embeddings) as api:
        own = with_openai_embedder(settings, api.url, query_timeout_seconds=0.2)
        own = own.model_copy(
            update={"memory": own.memory.model_copy(update={"recall_query_timeout_seconds": 2.0})}
        )
        try:
            with run_server(own) as server:
                async with httpx.AsyncClient(
                    base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
                ) as http:
                    created = await http.put("/v1/sessions/budget", json={})
                    assert created.status_code == 200, created.text
                    stored = await http.post(
                        "/v1/sessions/budget/memory",
                        json={"type": "remember", "text": "Refund order number: ORD-58213."},
                    )
                    assert stored.status_code == 200, stored.text
                    answers = []
                    for query in (SLOW, HUNG):
                        answer = await http.post(
                            "/v1/sessions/budget/memory", json={"type": "recall", "query": query}
                        )
                        assert answer.status_code == 200, answer.text
                        answers.append(answer.json()["data"])
        finally:
            release.set()
    slow, hung = answers
    # 0.8 s is past the build budget (0.2 s) but within recall's (2 s): the vector arm ran.
    assert slow["fallbacks"] == [], slow
    assert "ORD-58213" in slow["matches"][0]["text"]
    # Past recall's own budget it goes on lexically, and says why.
    assert "vector_timeout" in hung["fallbacks"] and "vector_unavailable" in hung["fallbacks"]
    assert "ORD-58213" in hung["matches"][0]["text"]
