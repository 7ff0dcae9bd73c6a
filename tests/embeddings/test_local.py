"""In-process embedders against the real bundled models (no network, no mocks)."""

import asyncio
import os
import threading
from typing import Any

import numpy as np
import pytest

from app.embeddings.base import EmbedderTimeout, EmbedderUnavailable
from app.embeddings.factory import create_embedder
from app.embeddings.local import PASSAGE_NICENESS, QUERY_BATCH_MAX, E5Embedder, UseEmbedder

PASSAGES_EN = [
    "We deployed the billing service to eu-west-1 on Friday; the database is Postgres 16.",
    "My sister adopted a golden retriever puppy last weekend and named it Max.",
    "The recipe needs two cups of flour, one egg and a pinch of salt.",
]
PASSAGES_ZH = [
    "我们周五把账单服务部署到了欧洲区域，数据库用的是 Postgres 16。",
    "我妹妹上周末领养了一只金毛小狗，给它取名叫 Max。",
    "这个食谱需要两杯面粉、一个鸡蛋和一小撮盐。",
]


def assert_unit_rows(vectors: np.ndarray, n: int, dim: int) -> None:
    assert vectors.shape == (n, dim)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def assert_same_rows(got: np.ndarray, expected: np.ndarray) -> None:
    """Equal up to float32 rounding: BLAS sums a row in an order that depends on how many rows
    are multiplied together, so a text's vector moves in its last bits with its batch."""
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


async def top_passage(embedder: E5Embedder | UseEmbedder, query: str, passages: list[str]) -> int:
    q = await embedder.embed_queries([query])
    p = await embedder.embed_passages(passages)
    return int(np.argmax(p @ q[0]))


@pytest.fixture(scope="module")
def e5() -> E5Embedder:
    return E5Embedder()


async def test_e5_ranks_matching_english_passage_first(e5: E5Embedder) -> None:
    assert await top_passage(e5, "which region did the billing service go to?", PASSAGES_EN) == 0
    assert await top_passage(e5, "what is the name of the new dog?", PASSAGES_EN) == 1


async def test_e5_ranks_matching_chinese_passage_first(e5: E5Embedder) -> None:
    assert await top_passage(e5, "账单服务部署在哪个区域？", PASSAGES_ZH) == 0
    assert await top_passage(e5, "做这道菜要几个鸡蛋", PASSAGES_ZH) == 2


async def test_e5_vectors_are_384_d_unit_float32(e5: E5Embedder) -> None:
    assert (e5.name, e5.dim) == ("e5-small-q4", 384)
    assert_unit_rows(await e5.embed_passages(PASSAGES_EN + PASSAGES_ZH), 6, 384)
    assert_unit_rows(await e5.embed_queries(["hello", ""]), 2, 384)
    assert (await e5.embed_queries([])).shape == (0, 384)


async def test_e5_query_and_passage_modes_differ(e5: E5Embedder) -> None:
    q = await e5.embed_queries([PASSAGES_EN[0]])
    p = await e5.embed_passages([PASSAGES_EN[0]])
    assert not np.allclose(q, p)


async def test_e5_caps_input_to_max_tokens() -> None:
    capped = E5Embedder(max_tokens=40)
    head = "The deployment checklist for the billing service. " * 10
    a, b = await capped.embed_passages([head, head + "a completely different tail about cats"])
    assert_same_rows(a, b)  # the tail lies beyond the 40-token cap


async def test_e5_caps_input_to_max_chars() -> None:
    capped = E5Embedder(max_chars=30)
    a, b = await capped.embed_passages([PASSAGES_EN[0], PASSAGES_EN[0][:30]])
    assert_same_rows(a, b)


async def test_e5_concurrent_calls_match_serial(e5: E5Embedder) -> None:
    texts = [f"turn {i}: {PASSAGES_EN[i % 3]}" for i in range(12)]
    serial = await e5.embed_passages(texts)
    parallel = await asyncio.gather(*(e5.embed_passages([t]) for t in texts))
    assert_same_rows(np.vstack(parallel), serial)


async def test_e5_shares_one_loaded_model_and_warms_up(e5: E5Embedder) -> None:
    other = E5Embedder()
    assert other._lanes == e5._lanes
    assert other._lanes["query"].model is not other._lanes["passage"].model
    await other.warm_up()


async def test_a_query_never_waits_behind_a_passage_batch(e5: E5Embedder) -> None:
    started = threading.Event()
    long_batch = [f"{i}: " + " ".join(PASSAGES_EN) * 5 for i in range(16)]

    def batch(model: Any) -> Any:
        started.set()
        return model.encode(long_batch, False, 512)

    passages = asyncio.create_task(e5._lanes["passage"].run(batch))
    assert await asyncio.to_thread(started.wait, 60)
    vectors = await e5.embed_queries(["which region did the billing service go to?"])
    assert not passages.done()  # the query came back while the batch was still encoding
    assert_unit_rows(vectors, 1, 384)
    assert (await passages).shape == (16, 384)


def engine_pid(engine: Any) -> int:
    return int(engine.pid)


async def test_passages_encode_at_a_lower_cpu_priority(e5: E5Embedder) -> None:
    await e5.warm_up()
    query_pid = await e5._lanes["query"].run(engine_pid)
    passage_pid = await e5._lanes["passage"].run(engine_pid)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, query_pid) == base
    assert os.getpriority(os.PRIO_PROCESS, passage_pid) == min(base + PASSAGE_NICENESS, 19)


def cpu_ticks_by_thread(pid: int) -> list[int]:
    """User + system clock ticks of each thread of `pid`, most first."""
    ticks = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks.append(int(fields[11]) + int(fields[12]))
    return sorted(ticks, reverse=True)


async def test_each_engine_process_computes_on_one_thread(e5: E5Embedder) -> None:
    # One thread computes per engine: nothing left spinning on the cores the event loop needs.
    # (onnxruntime's import starts one more thread, which sleeps.)
    for _ in range(4):
        assert_unit_rows(await e5.embed_passages(PASSAGES_EN * 8), 24, 384)
        assert_unit_rows(await e5.embed_queries(QUERIES_MIXED), len(QUERIES_MIXED), 384)
    for kind in ("query", "passage"):
        pid = await e5._lanes[kind].run(engine_pid)
        busiest, *others = cpu_ticks_by_thread(pid)
        assert busiest > 0, kind
        assert sum(others) <= 1, (kind, busiest, others)


async def test_a_query_past_its_timeout_gives_up_and_the_lane_goes_on() -> None:
    embedder = E5Embedder()
    embedder.query_timeout_s = 0.05
    started, release = threading.Event(), threading.Event()

    def stuck(model: Any) -> bool:
        started.set()
        return release.wait(60)

    busy = asyncio.create_task(embedder._lanes["query"].run(stuck))
    assert await asyncio.to_thread(started.wait, 60)
    with pytest.raises(EmbedderTimeout, match=r"within 0\.05s"):
        await embedder.embed_queries(["queued behind a stuck call"])
    release.set()
    assert await busy
    embedder.query_timeout_s = 60
    assert_unit_rows(await embedder.embed_queries(["and now it answers"]), 1, 384)


def test_unknown_e5_model_is_unavailable() -> None:
    with pytest.raises(EmbedderUnavailable, match="unknown e5 model"):
        E5Embedder("e5-large")


def test_factory_builds_local_embedders() -> None:
    assert create_embedder("none") is None
    embedder = create_embedder("e5", max_tokens=256)
    assert isinstance(embedder, E5Embedder)
    assert embedder.max_tokens == 256
    with pytest.raises(EmbedderUnavailable, match="unknown embedder kind"):
        create_embedder("word2vec")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def use() -> UseEmbedder:
    # USE is a dependency of contextd: a missing package fails here, never skips.
    return UseEmbedder(threads=1)


async def test_use_ranks_matching_passages_first(use: UseEmbedder) -> None:
    assert await top_passage(use, "which region did the billing service go to?", PASSAGES_EN) == 0
    assert await top_passage(use, "做这道菜要几个鸡蛋", PASSAGES_ZH) == 2


async def test_use_vectors_are_512_d_unit_float32(use: UseEmbedder) -> None:
    assert use.dim == 512
    assert_unit_rows(await use.embed_passages(PASSAGES_EN + PASSAGES_ZH), 6, 512)
    assert isinstance(create_embedder("use"), UseEmbedder)


async def test_e5_accepts_nul_and_lone_surrogates(e5: E5Embedder) -> None:
    vectors = await e5.embed_passages(["broken \ud800 surrogate", "nul\x00inside", "ok?"])
    assert_unit_rows(vectors, 3, 384)


async def test_warm_up_is_not_bounded_by_the_query_timeout() -> None:
    embedder = E5Embedder()
    embedder.query_timeout_s = 1e-9  # no query could meet it; a cold start must not either
    await embedder.warm_up()
    with pytest.raises(EmbedderTimeout):
        await embedder.embed_queries(["a real query is bounded"])


QUERIES_MIXED = [
    "what did we say about the hotel and the visa 1234?",
    "账单服务部署在哪个区域？",
    "and that one?",
    "做这道菜要几个鸡蛋",
    "Which region did the billing service go to, and what database does it run on? " * 30,
    "",
]


async def until_queued(lane: Any, calls: int) -> None:
    """Wait (with a deadline) until `calls` calls sit in the held lane's queue."""
    deadline = asyncio.get_running_loop().time() + 30
    while lane.queued.qsize() < calls:
        assert asyncio.get_running_loop().time() < deadline, lane.queued.qsize()
        await asyncio.sleep(0)
    assert lane.queued.qsize() == calls


class HeldLane:
    """Keeps a lane's thread busy until released, so calls made meanwhile queue up."""

    def __init__(self, lane: Any) -> None:
        self.lane = lane
        self.started, self.release = threading.Event(), threading.Event()
        self.task: asyncio.Task[bool] | None = None

    async def __aenter__(self) -> "HeldLane":
        def hold(_model: Any) -> bool:
            self.started.set()
            return self.release.wait(60)

        self.task = asyncio.create_task(self.lane.run(hold))
        assert await asyncio.to_thread(self.started.wait, 60)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self.task is not None and await self.task


def recording(calls: list[list[str]], fail_on: str | None = None) -> Any:
    """A query encoder (the real model) that records the texts of each call it gets."""

    def encode(model: Any, texts: list[str]) -> np.ndarray:
        calls.append(list(texts))
        if fail_on is not None and fail_on in texts:
            raise ValueError(f"cannot encode {fail_on!r}")
        return model.encode(texts, True, 512)

    return encode


async def test_queued_queries_are_encoded_together_and_equal_single_calls(
    e5: E5Embedder,
) -> None:
    alone = [await e5.embed_queries([q]) for q in QUERIES_MIXED]
    pair = await e5.embed_queries(QUERIES_MIXED[:2])
    calls: list[list[str]] = []
    encode = recording(calls)
    lane = e5._lanes["query"]
    raw_alone = [await lane.encode_together(encode, [q]) for q in QUERIES_MIXED]
    calls.clear()
    async with HeldLane(lane):
        waiting = [asyncio.create_task(lane.encode_together(encode, [q])) for q in QUERIES_MIXED]
        through_embedder = [asyncio.create_task(e5.embed_queries([q])) for q in QUERIES_MIXED]
        pair_waiting = asyncio.create_task(e5.embed_queries(QUERIES_MIXED[:2]))
        await until_queued(lane, 2 * len(QUERIES_MIXED) + 1)  # all 13 calls wait
    rows = await asyncio.gather(*waiting)
    assert calls == [QUERIES_MIXED]  # one engine call for all six callers
    for got, single in zip(rows, raw_alone, strict=True):
        assert got.shape == (1, 384)
        assert_same_rows(got, single)
    # Through the embedder (normalised, every query embedded together): the same rows.
    for got, single in zip(await asyncio.gather(*through_embedder), alone, strict=True):
        assert_same_rows(got, single)
    assert_same_rows(await pair_waiting, pair)


async def test_a_waiter_that_leaves_does_not_break_the_batch(e5: E5Embedder) -> None:
    lane = e5._lanes["query"]
    calls: list[list[str]] = []
    encode = recording(calls)
    texts = ["first question about the invoice", "second, 第二个问题", "third about the refund"]
    alone = [await lane.encode_together(encode, [t]) for t in texts]
    calls.clear()
    async with HeldLane(lane):
        tasks = [asyncio.create_task(lane.encode_together(encode, [t])) for t in texts]
        await until_queued(lane, len(texts))
        tasks[1].cancel()  # its caller timed out while the lane was busy
        # Its queued call is cancelled by callbacks the loop runs before the cancelled task
        # ends: once it has, the lane may go on.
        with pytest.raises(asyncio.CancelledError):
            await tasks[1]
    assert_same_rows(await tasks[0], alone[0])
    assert_same_rows(await tasks[2], alone[2])
    assert calls == [[texts[0], texts[2]]]  # the leaver's text was not encoded

    # A caller that leaves once its batch is running: the batch still answers the others.
    running, finish = threading.Event(), threading.Event()

    def slow(model: Any, batch: list[str]) -> np.ndarray:
        running.set()
        finish.wait(60)
        return encode(model, batch)

    calls.clear()
    async with HeldLane(lane):
        tasks = [asyncio.create_task(lane.encode_together(slow, [t])) for t in texts]
        await until_queued(lane, len(texts))
    assert await asyncio.to_thread(running.wait, 60)
    tasks[0].cancel()
    finish.set()
    assert_same_rows(await tasks[1], alone[1])
    assert_same_rows(await tasks[2], alone[2])
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
    assert calls == [texts]


async def test_one_failing_query_in_a_batch_fails_only_its_caller(e5: E5Embedder) -> None:
    lane = e5._lanes["query"]
    calls: list[list[str]] = []
    encode = recording(calls, fail_on="odd one")
    async with HeldLane(lane):
        tasks = [
            asyncio.create_task(lane.encode_together(encode, [t]))
            for t in ["fine question", "odd one", "另一个问题"]
        ]
        await until_queued(lane, 3)
    good = await tasks[0]
    with pytest.raises(ValueError, match="cannot encode 'odd one'"):
        await tasks[1]
    other = await tasks[2]
    assert calls[0] == ["fine question", "odd one", "另一个问题"]  # tried together first
    assert sorted(map(tuple, calls[1:])) == [("fine question",), ("odd one",), ("另一个问题",)]
    assert_same_rows(good, await lane.encode_together(encode, ["fine question"]))
    assert_same_rows(other, await lane.encode_together(encode, ["另一个问题"]))


async def test_a_lane_call_takes_at_most_the_batch_cap(e5: E5Embedder) -> None:
    lane = e5._lanes["query"]
    calls: list[list[str]] = []
    encode = recording(calls)
    texts = [f"question number {i}" for i in range(QUERY_BATCH_MAX + 3)]
    async with HeldLane(lane):
        tasks = [asyncio.create_task(lane.encode_together(encode, [t])) for t in texts]
        await until_queued(lane, len(texts))
    await asyncio.gather(*tasks)
    assert calls == [texts[:QUERY_BATCH_MAX], texts[QUERY_BATCH_MAX:]]
