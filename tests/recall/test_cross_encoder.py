"""HttpReranker in each wire style against a real HTTP server on 127.0.0.1, and the in-process
cross-encoder (`recall.cross_encoder`) on its real model."""

from pathlib import Path
from typing import Any

import pytest

from app.embeddings.base import EmbedderUnavailable
from app.embeddings.reranker import MiniLMReranker, model_dir
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


def test_the_in_process_cross_encoder_scores_the_answer_first() -> None:
    """ms-marco-MiniLM from the `rerank` extra, loaded from its package and digest-checked."""
    model = MiniLMReranker()
    candidates = [
        "user: Tell me about rail passes please, part 12.\nassistant: A rail pass covers ...",
        "user: By the way, I am allergic to peanuts, so no satay for me.",
        "user: Which allergy tablets work fastest?\nassistant: Antihistamines such as ...",
    ]
    scores = model.scores("What am I allergic to?", candidates)
    assert len(scores) == 3
    assert max(range(3), key=lambda i: scores[i]) == 1
    assert model.scores("What am I allergic to?", []) == []


def test_a_model_file_other_than_the_measured_one_is_refused(tmp_path: Path) -> None:
    shipped = model_dir()
    for name in ("model.onnx", "tokenizer.json"):
        (tmp_path / name).write_bytes((shipped / name).read_bytes())
    with (tmp_path / "model.onnx").open("ab") as model:
        model.write(b"\0")  # one byte more: another file under the same name
    with pytest.raises(EmbedderUnavailable, match="not the cross-encoder"):
        MiniLMReranker(tmp_path)
