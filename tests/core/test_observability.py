"""Metrics at /metrics, request ids and JSON logs, through a real `contextd dev` (API and worker in
one process, one registry) on the test database, its stdout read as the JSON log."""

import json
import logging
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.core.config import Settings
from app.core.observability import (
    JsonFormatter,
    Metrics,
    accept_request_id,
    after_response,
    deferred_until_sent,
    request_id_var,
)
from app.embeddings.base import Embedder
from tests.offload.test_offload_service import SMALL
from tests.offload.test_worker import worker_env
from tests.support.server import free_port
from tests.support.waiting import wait_for

APPEND_ROUTE = "/v1/sessions/{session_id}/turns"
SERIES = [
    "contextd_http_request_duration_seconds",
    "contextd_build_prompt_stage_seconds",
    "contextd_prompt_tokens",
    "contextd_recall",
    "contextd_fallbacks",
    "contextd_offloads",
    "contextd_offload_tokens_freed",
    "contextd_notes_writes",
    "contextd_notes_stale_writes",
    "contextd_job_queue_depth",
    "contextd_job_queue_oldest_age_seconds",
    "contextd_embed_seconds",
]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def families(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def contextd_dev(settings: Settings, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`contextd dev --auth` on the test database and Valkey; its stdout goes to a file."""
    port = free_port()
    log = tmp_path / "stdout.log"
    env = worker_env(settings) | {"CONTEXTD_LOG_LEVEL": "INFO", "CONTEXTD_LOG_FORMAT": "json"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.runtime.cli", "dev", "--auth", "--port", str(port)],
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield f"http://127.0.0.1:{port}", log
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def json_lines(log: Path) -> list[dict[str, object]]:
    """The JSON log lines of stdout (the dev banner lines are plain text)."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


async def test_metrics_request_ids_and_logs_after_a_workload(
    contextd_dev: tuple[str, Path], api_key: str, tenant_name: str
) -> None:
    url, log = contextd_dev
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:

        async def healthz() -> int:
            try:
                return (await http.get("/healthz")).status_code
            except httpx.TransportError:
                return 0

        await wait_for(healthz, lambda s: s == 200, timeout=120, what="contextd dev to start")
        assert (await http.put("/v1/sessions/obs", json=SMALL)).status_code == 200
        for i in range(100):
            resp = await http.post(
                "/v1/sessions/obs/turns",
                json={
                    "turns": [
                        {
                            "role": "user" if i % 2 == 0 else "assistant",
                            "content": f"turn {i}: the budget must not exceed {100 + i} EUR. "
                            + "We compare trains and hotels for the trip to Lyon. " * 8,
                        }
                    ]
                },
                headers={"X-Request-ID": f"append-{i}"},
            )
            assert resp.status_code == 201
            assert resp.headers["X-Request-ID"] == f"append-{i}"
            if resp.json()["offload_enqueued"]:
                break
        else:
            pytest.fail("the workload never crossed the watermark")

        async def scrape() -> str:
            resp = await http.get("/metrics")
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/plain")
            return resp.text

        text = await wait_for(
            scrape,
            lambda t: (
                value(t, "contextd_offloads_total", trigger="watermark") >= 1
                and value(t, "contextd_notes_writes_total") >= 1
            ),
            interval=0.2,
            what="the worker's offload and notes write to be counted",
        )

        assert set(SERIES) <= families(text), set(SERIES) - families(text)
        appends = value(
            text,
            "contextd_http_request_duration_seconds_count",
            route=APPEND_ROUTE,
            method="POST",
            status="201",
        )
        assert appends == i + 1
        assert value(text, "contextd_offload_tokens_freed_total") > 0
        assert value(text, "contextd_notes_stale_writes_total") == 0
        assert ("contextd_job_queue_depth", (("queue", "contextd"),)) in samples(text)
        assert value(text, "contextd_recall_total", outcome="hit") == 0  # present, at zero
        # Route templates, never raw paths: a session id must not become a label value.
        assert "/v1/sessions/obs/turns" not in text

        generated = await http.get("/v1/sessions/obs")
        assert re.fullmatch(r"[0-9a-f]{32}", generated.headers["X-Request-ID"])
        for bad in ("has space", "x" * 129, "semi;colon"):
            resp = await http.get("/v1/sessions/obs", headers={"X-Request-ID": bad})
            assert re.fullmatch(r"[0-9a-f]{32}", resp.headers["X-Request-ID"])
        missing = await http.get("/v1/sessions/nope", headers={"X-Request-ID": "req.404_x"})
        assert missing.status_code == 404 and missing.headers["X-Request-ID"] == "req.404_x"

        lines = await wait_for(
            lambda: _read(log),
            lambda ls: any(line.get("request_id") == "req.404_x" for line in ls),
            what="the access log line of the last request",
        )
    first = next(line for line in lines if line["request_id"] == "append-0")
    assert first["logger"] == "contextd.access" and first["level"] == "INFO"
    assert first["route"] == APPEND_ROUTE and first["status"] == 201
    assert first["tenant"] == tenant_name and first["method"] == "POST"
    assert isinstance(first["duration_ms"], float) and first["duration_ms"] > 0
    assert str(first["ts"]).endswith("+00:00")
    assert first["message"] == f"POST {APPEND_ROUTE} 201"
    not_found = next(line for line in lines if line["request_id"] == "req.404_x")
    assert not_found["status"] == 404
    # The worker serves the whole test database: its sweeper may also offload a session another
    # test left over its watermark, so the line of this session's offload is the watermark's.
    offloaded = [line for line in lines if line["logger"] == "contextd.offload"]
    watermark = [line for line in offloaded if line["trigger"] == "watermark"]
    assert watermark and int(str(watermark[0]["tokens_freed"])) > 0
    assert re.fullmatch(r"[0-9a-f-]{36}", str(watermark[0]["session"]))
    assert {"uvicorn.error", "contextd.access"} <= {line["logger"] for line in lines}


async def _read(log: Path) -> list[dict[str, object]]:
    return json_lines(log)


def test_json_formatter_carries_request_id_extras_and_exceptions() -> None:
    record = logging.makeLogRecord(
        {
            "name": "contextd.test",
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": "moved %d turns",
            "args": (3,),
            "tenant": "acme",
            "session": "s1",
        }
    )
    token = request_id_var.set("rid-1")
    try:
        line = JsonFormatter().format(record)
    finally:
        request_id_var.reset(token)
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "moved 3 turns" and out["request_id"] == "rid-1"
    assert (out["tenant"], out["session"], out["level"]) == ("acme", "s1", "WARNING")
    try:
        raise ValueError("boom")
    except ValueError:
        err = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, True)
        err.exc_info = __import__("sys").exc_info()
    out = json.loads(JsonFormatter().format(err))
    assert out["request_id"] is None and "ValueError: boom" in out["exc"]


def test_accept_request_id() -> None:
    assert accept_request_id("abc-DEF_1.2") == "abc-DEF_1.2"
    assert accept_request_id("a" * 128) == "a" * 128
    for bad in (None, "", "a" * 129, "a b", "é", "x\n"):
        assert re.fullmatch(r"[0-9a-f]{32}", accept_request_id(bad))


class CountingEmbedder(Embedder):
    name = "counting"
    dim = 2

    async def _encode(self, texts: list[str], *, query: bool) -> np.ndarray:
        return np.ones((len(texts), self.dim))


async def test_embedder_observer_and_build_api_feed_their_own_registry() -> None:
    first, second = Metrics(), Metrics()  # two instances in one process do not collide
    embedder = CountingEmbedder()
    embedder.observer = first.observe_embed
    texts: Sequence[str] = ["a", "b"]
    await embedder.embed_queries(texts)
    await embedder.embed_passages(texts)
    await embedder.embed_passages(texts)
    get = first.registry.get_sample_value
    assert get("contextd_embed_seconds_count", {"kind": "query"}) == 1
    assert get("contextd_embed_seconds_count", {"kind": "passage"}) == 2
    assert second.registry.get_sample_value("contextd_embed_seconds_count", {"kind": "query"}) == 0

    first.observe_build(
        {"recall": 12.0, "assemble": 1.5},
        {"c0": 100, "c1": 900, "c2": 50, "recall": 300, "limit": {"x": 1}},  # type: ignore[dict-item]
        ["vector_unavailable", "rerank_timeout"],
        recall_hit=True,
    )
    first.observe_build({}, {}, [], recall_hit=False)
    first.observe_build({}, {}, ["vector_unavailable"], recall_hit=None)
    assert get("contextd_build_prompt_stage_seconds_sum", {"stage": "recall"}) == 0.012
    assert get("contextd_prompt_tokens_sum", {"layer": "c1"}) == 900
    assert get("contextd_prompt_tokens_count", {"layer": "limit"}) is None
    assert get("contextd_fallbacks_total", {"kind": "vector_unavailable"}) == 2
    assert get("contextd_recall_total", {"outcome": "hit"}) == 1
    assert get("contextd_recall_total", {"outcome": "miss"}) == 1
    first.observe_offload("emergency", 250)
    first.observe_notes_write("stale")
    first.observe_notes_write("failed")
    assert get("contextd_offloads_total", {"trigger": "emergency"}) == 1
    assert get("contextd_offload_tokens_freed_total") == 250
    assert get("contextd_notes_stale_writes_total") == 1
    assert get("contextd_notes_writes_total") == 0


def test_actions_deferred_until_sent_run_when_the_block_ends_and_at_once_elsewhere() -> None:
    done: list[str] = []
    after_response(lambda: done.append("outside"))
    assert done == ["outside"]
    with deferred_until_sent():
        after_response(lambda: done.append("build line"))
        after_response(lambda: done.append("metrics"))
        assert done == ["outside"]
        done.append("response sent")
    assert done == ["outside", "response sent", "build line", "metrics"]
    after_response(lambda: done.append("after"))  # the block's deferral ended with it
    assert done[-1] == "after"
