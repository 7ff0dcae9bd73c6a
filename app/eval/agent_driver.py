"""The `contextd eval agent` driver: replays tool-calling trajectories into a *running* contextd
over HTTP only, as an agent loop would, and keeps what each build returned for scoring
(`app.eval.agent_score`).

Per run and context limit C: a fresh session (`PUT /v1/sessions/{id}` with the limit and the
reserve), then the messages after the system prompt in order, each appended on its own
(`POST /v1/sessions/{id}/turns`); before each assistant message that calls tools, one
`POST /v1/sessions/{id}/build-prompt` with the system prompt and no query, as
`examples/python/agent_loop.py` does. Nothing waits for the worker between steps (an agent does
not), so figures may move a little from one run to the next. An append the server refuses (4xx)
ends that replay: the run is recorded as rejected at append, the builds before it are kept.
"""

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.progress import Progress, say
from app.eval.agent import WIRE_FIELDS, AgentRun
from app.eval.driver import check_response, server_client


@dataclass
class AgentEvalConfig:
    url: str
    api_key: str | None = None
    limits: tuple[int, ...] = (2500, 3500, 6000, 12000)
    reserve_tokens: int = 500
    concurrency: int = 2  # (run, limit) replays in flight
    tune_tasks: tuple[int, ...] = tuple(range(12))  # the other tasks form the check split
    clearing_keep: int = 3
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])


@dataclass
class BuildObservation:
    """What one build-prompt returned before step `ordinal` of a run."""

    ordinal: int
    messages: list[dict[str, Any]] | None  # None: the build failed
    tokens: int  # usage.total (0 when the build failed)
    wall_ms: float
    fallbacks: list[str]
    error: str | None = None  # "http_<status> <code>" or "dropped"


@dataclass
class Rejection:
    """The append the server refused; the replay stopped there."""

    message_index: int
    role: str
    status: int
    code: str
    field: str | None
    message: str


@dataclass
class Replay:
    run: AgentRun
    limit: int
    session_id: str
    builds: list[BuildObservation]
    rejection: Rejection | None
    appended: int  # messages stored
    elapsed_s: float


def _error_of(resp: Any) -> tuple[str, str | None, str]:
    try:
        error = resp.json().get("error") or {}
    except ValueError:
        error = {}
    return str(error.get("code", "")), error.get("field"), str(error.get("message", resp.text))


def wire_turn(message: dict[str, Any]) -> dict[str, Any]:
    """A trajectory message as an append's turn (the OpenAI fields only)."""
    return {k: message[k] for k in WIRE_FIELDS if message.get(k) is not None}


async def _build(http: Any, sid: str, system: str, ordinal: int) -> BuildObservation:
    import httpx

    body = {"system": system, "format": "openai"}
    started = time.perf_counter()
    try:
        resp = await http.post(f"/v1/sessions/{sid}/build-prompt", json=body)
    except httpx.TransportError:
        return BuildObservation(
            ordinal, None, 0, (time.perf_counter() - started) * 1000, [], "dropped"
        )
    wall = (time.perf_counter() - started) * 1000
    if resp.status_code >= 400:
        code, _, _ = _error_of(resp)
        return BuildObservation(
            ordinal, None, 0, wall, [], f"http_{resp.status_code} {code}".strip()
        )
    out = resp.json()
    return BuildObservation(
        ordinal=ordinal,
        messages=list(out["messages"]),
        tokens=int(out["usage"]["total"]),
        wall_ms=wall,
        fallbacks=list(out.get("fallbacks") or []),
    )


async def replay_run(http: Any, cfg: AgentEvalConfig, run: AgentRun, limit: int) -> Replay:
    """Replay one run into a fresh session with context limit `limit` (see the module)."""
    started = time.monotonic()
    sid = f"agent-{run.key}-c{limit}-{cfg.run_id}"
    check_response(
        await http.put(
            f"/v1/sessions/{sid}",
            json={
                "context_limit": limit,
                "reserve_tokens": cfg.reserve_tokens,
                "metadata": {"eval": "agent", "task_id": run.task_id, "trial": run.trial},
            },
        ),
        f"configure {sid}",
    )
    steps = {s.index: s for s in run.steps}
    builds: list[BuildObservation] = []
    rejection: Rejection | None = None
    appended = 0
    for index, message in enumerate(run.messages):
        if index in steps:
            builds.append(await _build(http, sid, run.system, steps[index].ordinal))
        resp = await http.post(f"/v1/sessions/{sid}/turns", json={"turns": [wire_turn(message)]})
        if 400 <= resp.status_code < 500:
            code, fld, text = _error_of(resp)
            rejection = Rejection(index, str(message["role"]), resp.status_code, code, fld, text)
            break
        check_response(resp, f"append to {sid}")
        appended += 1
    return Replay(run, limit, sid, builds, rejection, appended, time.monotonic() - started)


async def run_agent_eval(
    runs: Sequence[AgentRun], cfg: AgentEvalConfig, *, log: Callable[[str], None] = say
) -> list[Replay]:
    """Every run at every limit, `cfg.concurrency` replays at a time, limits in order."""
    semaphore = asyncio.Semaphore(cfg.concurrency)
    async with server_client(cfg.url, cfg.api_key, connections=max(4, cfg.concurrency * 2)) as http:
        check_response(await http.get("/healthz"), "healthz")
        replayed = Progress("runs replayed", len(runs) * len(cfg.limits))

        async def one(run: AgentRun, limit: int) -> Replay:
            async with semaphore:
                replay = await replay_run(http, cfg, run, limit)
            rejected = (
                f", rejected at message {replay.rejection.message_index}"
                if replay.rejection
                else ""
            )
            builds = len(replay.builds)
            log(f"C={limit} {run.key}: {builds} builds in {replay.elapsed_s:.1f}s{rejected}")
            replayed.advance()
            return replay

        return list(
            await asyncio.gather(*(one(run, limit) for limit in cfg.limits for run in runs))
        )
