"""HttpReranker in each wire style against a real HTTP server on 127.0.0.1."""

from typing import Any

import pytest

from app.recall.cross_encoder import HttpReranker, RerankStyle, RerankUnavailable
from tests.support.loopback import closed_port_url, loopback_server

DOCS = ["alpha doc", "beta doc", "gamma doc"]
SCORES = [0.1, 0.9, 0.5]


def tei(method: str, path: str, body: Any) -> tuple[int, Any]:
    ranked = sorted(range(len(body["texts"])), key=lambda i: -SCORES[i])
    return 200, [{"index": i, "score": SCORES[i]} for i in ranked]


def jina_or_cohere(method: str, path: str, body: Any) -> tuple[int, Any]:
    ranked = sorted(range(len(body["documents"])), key=lambda i: -SCORES[i])
    results = [{"index": i, "relevance_score": SCORES[i]} for i in ranked]
    return 200, {"model": body["model"], "results": results[: body["top_n"]]}


async def test_tei_style() -> None:
    with loopback_server(tei) as srv:
        reranker = HttpReranker(srv.url, "tei")
        assert await reranker.rerank("which?", DOCS) == SCORES
        await reranker.aclose()
    assert srv.requests == [
        ("POST", "/rerank", {"query": "which?", "texts": DOCS, "truncate": True})
    ]


@pytest.mark.parametrize("style", ["jina", "cohere"])
async def test_jina_and_cohere_styles(style: RerankStyle) -> None:
    with loopback_server(jina_or_cohere) as srv:
        reranker = HttpReranker(srv.url + "/", style, model="rerank-m", api_key="k", timeout_s=2)
        assert await reranker.rerank("which?", DOCS) == SCORES
        await reranker.aclose()
    body = {"model": "rerank-m", "query": "which?", "documents": DOCS, "top_n": 3}
    assert srv.requests == [("POST", "/v1/rerank", body)]


async def test_base_url_with_v1_is_not_doubled() -> None:
    with loopback_server(jina_or_cohere) as srv:
        reranker = HttpReranker(srv.url + "/v1", "cohere", model="m")
        await reranker.rerank("q", DOCS)
        await reranker.aclose()
    assert srv.requests[0][1] == "/v1/rerank"


@pytest.mark.parametrize("style", ["tei", "jina", "cohere"])
async def test_server_error_is_unavailable(style: RerankStyle) -> None:
    with loopback_server(lambda m, p, b: (500, {"error": "boom"})) as srv:
        reranker = HttpReranker(srv.url, style, model="m")
        with pytest.raises(RerankUnavailable, match="HTTP 500"):
            await reranker.rerank("q", DOCS)
        await reranker.aclose()
    assert len(srv.requests) == 1


async def test_incomplete_results_are_unavailable() -> None:
    def partial(method: str, path: str, body: Any) -> tuple[int, Any]:
        return 200, {"results": [{"index": 1, "relevance_score": 0.9}]}

    with loopback_server(partial) as srv:
        reranker = HttpReranker(srv.url, "jina", model="m")
        with pytest.raises(RerankUnavailable, match="scored 1 of 3"):
            await reranker.rerank("q", DOCS)
        await reranker.aclose()


async def test_closed_port_is_unavailable() -> None:
    reranker = HttpReranker(closed_port_url(), "tei", timeout_s=1)
    with pytest.raises(RerankUnavailable, match="cannot reach reranker"):
        await reranker.rerank("q", DOCS)
    await reranker.aclose()


async def test_no_documents_makes_no_request() -> None:
    with loopback_server(tei) as srv:
        reranker = HttpReranker(srv.url, "tei")
        assert await reranker.rerank("q", []) == []
        await reranker.aclose()
    assert srv.requests == []


def test_jina_and_cohere_need_a_model() -> None:
    with pytest.raises(RerankUnavailable, match="needs a model"):
        HttpReranker("http://127.0.0.1:1", "cohere")
