"""OpenAIEmbedder against a real HTTP server on 127.0.0.1."""

import threading
from typing import Any

import numpy as np
import pytest

from app.embeddings.base import EmbedderUnavailable
from app.embeddings.factory import create_embedder
from app.embeddings.openai import OpenAIEmbedder
from tests.support.loopback import Handler, closed_port_url, loopback_server

DIM = 4


def vector_for(text: str, dim: int = DIM) -> list[float]:
    """A deterministic, deliberately unnormalised vector per text."""
    return [float(len(text) + 1)] + [float(i + 1) for i in range(dim - 1)]


def embeddings_handler(dim: int = DIM) -> Handler:
    def handle(method: str, path: str, body: Any) -> tuple[int, Any]:
        data = [
            {"object": "embedding", "index": i, "embedding": vector_for(text, dim)}
            for i, text in enumerate(body["input"])
        ]
        return 200, {"object": "list", "data": data[::-1], "model": body["model"]}

    return handle


def embedder(url: str, **kwargs: Any) -> OpenAIEmbedder:
    kwargs.setdefault("backoff_s", 0.01)
    return OpenAIEmbedder(url, "test-embed", None, DIM, **kwargs)


async def test_batches_inputs_and_returns_normalised_rows_in_order() -> None:
    texts = [f"text number {i}" + "x" * i for i in range(5)]
    with loopback_server(embeddings_handler()) as srv:
        client = embedder(srv.url, batch_size=2)
        vectors = await client.embed_passages(texts)
        await client.aclose()
    assert [(m, p) for m, p, _ in srv.requests] == [("POST", "/v1/embeddings")] * 3
    assert [body["input"] for _, _, body in srv.requests] == [texts[0:2], texts[2:4], texts[4:5]]
    assert all(body["model"] == "test-embed" for _, _, body in srv.requests)
    assert vectors.shape == (5, DIM) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    expected = np.array([vector_for(t) for t in texts])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, expected, atol=1e-6)


async def test_base_url_may_end_with_v1_and_prefixes_mark_queries() -> None:
    with loopback_server(embeddings_handler()) as srv:
        client = embedder(srv.url + "/v1/", query_prefix="query: ", passage_prefix="passage: ")
        await client.embed_queries(["a"])
        await client.embed_passages(["b"])
        await client.aclose()
    assert [(p, body["input"]) for _, p, body in srv.requests] == [
        ("/v1/embeddings", ["query: a"]),
        ("/v1/embeddings", ["passage: b"]),
    ]


async def test_long_inputs_are_capped_before_sending() -> None:
    with loopback_server(embeddings_handler()) as srv:
        client = embedder(srv.url, max_chars=10)
        await client.embed_passages(["0123456789abcdef"])
        await client.aclose()
    assert srv.requests[0][2]["input"] == ["0123456789"]


@pytest.mark.parametrize("status", [500, 429])
async def test_retries_after_one_server_error(status: int) -> None:
    calls: list[int] = []
    ok = embeddings_handler()

    def flaky(method: str, path: str, body: Any) -> tuple[int, Any]:
        calls.append(1)
        return (status, {"error": "try again"}) if len(calls) == 1 else ok(method, path, body)

    with loopback_server(flaky) as srv:
        client = embedder(srv.url)
        vectors = await client.embed_queries(["hello"])
        await client.aclose()
    assert len(srv.requests) == 2
    assert srv.requests[0][2] == srv.requests[1][2]
    assert vectors.shape == (1, DIM)


async def test_gives_up_after_max_retries() -> None:
    with loopback_server(lambda m, p, b: (503, {"error": "overloaded"})) as srv:
        client = embedder(srv.url, max_retries=2)
        with pytest.raises(EmbedderUnavailable, match=r"HTTP 503.*after 3 attempts"):
            await client.embed_queries(["hello"])
        await client.aclose()
    assert len(srv.requests) == 3


async def test_client_errors_are_not_retried() -> None:
    with loopback_server(lambda m, p, b: (401, {"error": "bad key"})) as srv:
        client = embedder(srv.url)
        with pytest.raises(EmbedderUnavailable, match="HTTP 401"):
            await client.embed_queries(["hello"])
        await client.aclose()
    assert len(srv.requests) == 1


async def test_closed_port_is_unavailable() -> None:
    url = closed_port_url()
    client = embedder(url, max_retries=1)
    with pytest.raises(EmbedderUnavailable, match="cannot reach embeddings server"):
        await client.embed_passages(["hello"])
    await client.aclose()


async def test_slow_server_times_out() -> None:
    release = threading.Event()

    def slow(method: str, path: str, body: Any) -> tuple[int, Any]:
        release.wait(timeout=5)  # answers only once the test is done with it
        return embeddings_handler()(method, path, body)

    with loopback_server(slow) as srv:
        client = embedder(srv.url, timeout_s=0.1, max_retries=0)
        with pytest.raises(EmbedderUnavailable, match="ReadTimeout"):
            await client.embed_passages(["hello"])
        await client.aclose()
        release.set()


async def test_wrong_dimension_is_unavailable() -> None:
    with loopback_server(embeddings_handler(dim=DIM + 1)) as srv:
        client = embedder(srv.url)
        with pytest.raises(EmbedderUnavailable, match="5-d vectors but the configured dimension"):
            await client.embed_passages(["hello"])
        await client.aclose()
    assert len(srv.requests) == 1


async def test_wrong_vector_count_is_unavailable() -> None:
    with loopback_server(lambda m, p, b: (200, {"data": []})) as srv:
        client = embedder(srv.url)
        with pytest.raises(EmbedderUnavailable, match="0 vectors for 1"):
            await client.embed_passages(["hello"])
        await client.aclose()


async def test_empty_input_makes_no_request() -> None:
    with loopback_server(embeddings_handler()) as srv:
        client = embedder(srv.url)
        assert (await client.embed_queries([])).shape == (0, DIM)
        await client.aclose()
    assert srv.requests == []


def test_missing_base_url_is_a_clear_error() -> None:
    with pytest.raises(EmbedderUnavailable, match="needs a base_url"):
        create_embedder("openai", base_url=None, model="m", dim=DIM)
    with pytest.raises(EmbedderUnavailable, match="needs a base_url"):
        OpenAIEmbedder("", "m", None, DIM)


async def test_factory_builds_openai_embedder() -> None:
    with loopback_server(embeddings_handler()) as srv:
        client = create_embedder("openai", base_url=srv.url, model="test-embed", dim=DIM)
        assert isinstance(client, OpenAIEmbedder)
        assert (client.name, client.dim) == ("test-embed", DIM)
        assert (await client.embed_queries(["x"])).shape == (1, DIM)
        await client.aclose()
