"""The LoCoMo evaluation driver: talks to a *running* contextd over HTTP only (ingest, wait for
the worker, one build-prompt per question and budget, and with `memory_tool` the memory tool's
`recall` at the same budget; with `answering` or `ablate` the build at the answer budget answered
and taken apart by `app.eval.answer_eval`), then scores with `app.eval.locomo`."""

import asyncio
import statistics
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from app.core.progress import Progress, say
from app.domain.tokens import count_tokens
from app.eval.answer_eval import AblationResult, AnswerResult, answer_and_ablate, shown_lines
from app.eval.answering import AnswerSetup, llm_client
from app.eval.locomo import (
    RANKING_LIMIT,
    SCORED_CATEGORIES,
    Conversation,
    Question,
    QuestionResult,
    bm25_baseline,
    coverage,
    dia_ids_of_range,
    recall_at_k,
    truncation_baseline,
)


@dataclass
class EvalConfig:
    url: str
    api_key: str | None = None
    budgets: tuple[int, ...] = (250, 500, 1000, 2000)
    ks: tuple[int, ...] = (5, 10)
    tune_conversations: int = 4  # the first N conversations form the tune split, the rest check
    context_limit: int = 4000
    reserve_tokens: int = 500
    min_recent_turns: int = 4
    min_recent_tokens: int = 500
    target_ratio: float = 0.1
    top_k: int = 50
    wait_embedded: bool = True
    ingest_timeout_s: float = 900.0
    concurrency: int = 1
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    per_item_max_tokens: int = 300  # for the framed BM25 variant (the server's default)
    reuse_run_id: str | None = None  # evaluate sessions an earlier run ingested (no ingestion)
    categories: tuple[int, ...] = (1, 2, 3, 4, 5)  # question categories asked
    memory_tool: bool = False  # also score the memory tool's recall at each budget
    answering: AnswerSetup | None = None  # `--answer-llm`: answer each question, judge it
    ablate: bool = False  # remove each fragment of the build at `answer_budget` in turn
    answer_budget: int = 1000  # the build the answering model reads and the ablation takes apart


@dataclass
class BuildSample:
    """Observations of one build-prompt call."""

    budget: int
    wall_ms: float
    timings_ms: dict[str, float]
    fallbacks: list[str]
    injected: int
    items: int
    error: bool = False  # the server answered 5xx


@dataclass
class ConversationRun:
    sample_id: str
    session_id: str
    turns: int
    chunks: int
    chunk_tokens_mean: float
    window_turns: int
    ingest_s: float
    ready_s: float


@dataclass
class LocomoRun:
    config: EvalConfig
    conversations: list[ConversationRun]
    contextd: list[QuestionResult]
    bm25: list[QuestionResult]
    bm25_framed: list[QuestionResult]
    truncation: list[QuestionResult]
    builds: list[BuildSample]
    # The memory tool's recall at the same budgets (empty unless `memory_tool`), and its calls.
    tool: list[QuestionResult]
    tool_calls: list[BuildSample]
    evidence_dropped: list[tuple[str, str, str]]  # (sample_id, raw evidence, dropped part)
    questions_without_evidence: int
    elapsed_s: float
    answers: list[AnswerResult] = field(default_factory=list)  # with `answering`
    ablations: list[AblationResult] = field(default_factory=list)  # with `ablate`


class EvalError(RuntimeError):
    pass


# An eval sends thousands of requests a minute; a key's rate limit (6,000 a minute by default)
# answers 429 with Retry-After. The request is sent again after that wait, at most this long.
RATE_LIMIT_MAX_WAIT_S = 60.0


def server_client(
    url: str,
    api_key: str | None,
    *,
    connections: int = 4,
    max_wait_s: float = RATE_LIMIT_MAX_WAIT_S,
) -> Any:
    """An `httpx.AsyncClient` on a running contextd (bearer key when given, 120 s timeout) that
    sends a request again after the Retry-After of a 429 (at most `max_wait_s`)."""
    import httpx

    class RateLimitRetry(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self._inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=connections))

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            while True:
                response = await self._inner.handle_async_request(request)
                if response.status_code != 429:
                    return response
                await response.aclose()
                try:
                    wait = float(response.headers.get("Retry-After", "1"))
                except ValueError:
                    wait = 1.0
                await asyncio.sleep(min(max(wait, 0.0), max_wait_s))

        async def aclose(self) -> None:
            await self._inner.aclose()

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(
        base_url=url.rstrip("/"), headers=headers, timeout=120, transport=RateLimitRetry()
    )


def check_response(resp: Any, what: str) -> Any:
    """The JSON body of `resp`; an `EvalError` naming `what` on a 4xx/5xx."""
    if resp.status_code >= 400:
        raise EvalError(f"{what}: HTTP {resp.status_code} {resp.text[:300]}")
    return resp.json()


async def _ingest(
    http: Any, cfg: EvalConfig, conv: Conversation, progress: Progress | None = None
) -> tuple[str, dict[int, str]]:
    sid = f"locomo-{conv.sample_id}-{cfg.run_id}"
    base = f"/v1/sessions/{sid}"
    check_response(
        await http.put(
            base,
            json={
                "context_limit": cfg.context_limit,
                "reserve_tokens": cfg.reserve_tokens,
                "min_recent_turns": cfg.min_recent_turns,
                "min_recent_tokens": cfg.min_recent_tokens,
                "target_ratio": cfg.target_ratio,
                "metadata": {"eval": "locomo", "sample_id": conv.sample_id},
            },
        ),
        f"configure {sid}",
    )
    seq_to_dia: dict[int, str] = {}
    turns = list(conv.turns)
    for start in range(0, len(turns), 100):
        batch = turns[start : start + 100]
        body = {
            "turns": [
                {
                    "role": "user" if t.speaker == conv.speaker_a else "assistant",
                    "content": t.content,
                    # `time`: when the turn was said (dates chunks and their search terms).
                    "metadata": {"dia_id": t.dia_id, "session_date": t.date, "time": t.date},
                }
                for t in batch
            ]
        }
        out = check_response(await http.post(f"{base}/turns", json=body), f"append to {sid}")
        for t, stored in zip(batch, out["turns"], strict=True):
            seq_to_dia[int(stored["seq"])] = t.dia_id
        if progress is not None:
            progress.advance(len(batch))
    return sid, seq_to_dia


async def _mapped_session(
    http: Any, cfg: EvalConfig, conv: Conversation, run_id: str
) -> tuple[str, dict[int, str]]:
    """An earlier run's session: seq → dia_id read back from the turns' metadata."""
    sid = f"locomo-{conv.sample_id}-{run_id}"
    seq_to_dia: dict[int, str] = {}
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = check_response(
            await http.get(f"/v1/sessions/{sid}/turns", params=params), f"turns {sid}"
        )
        for t in page["turns"]:
            dia = (t.get("metadata") or {}).get("dia_id")
            if dia is not None:
                seq_to_dia[int(t["seq"])] = str(dia)
        cursor = page.get("next_cursor")
        if not cursor:
            break
    if sorted(seq_to_dia.values()) != sorted(t.dia_id for t in conv.turns):
        raise EvalError(f"session {sid} does not hold conversation {conv.sample_id}")
    return sid, seq_to_dia


async def _list_chunks(http: Any, sid: str) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500}
        if cursor:
            params["cursor"] = cursor
        page = check_response(await http.get(f"/v1/sessions/{sid}/chunks", params=params), "chunks")
        chunks.extend(page["chunks"])
        cursor = page.get("next_cursor")
        if not cursor:
            return chunks


async def pending_jobs(http: Any) -> int:
    """Jobs waiting in the worker queue (`/readyz`; a 503 for worker lag still reports it)."""
    ready = (await http.get("/readyz")).json()
    return int((ready.get("worker") or {}).get("pending_jobs", 0))


async def wait_for_jobs(http: Any, timeout_s: float) -> None:
    """Poll until the worker queue is empty; raise after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (pending := await pending_jobs(http)) > 0:
        if time.monotonic() > deadline:
            raise EvalError(f"{pending} jobs still pending after {timeout_s}s")
        await asyncio.sleep(0.5)


async def _wait_ready(http: Any, cfg: EvalConfig, sids: Sequence[str]) -> list[dict[str, Any]]:
    """Poll until every session is offloaded below its trigger, the worker queue is empty and
    (when asked) every chunk is embedded; raise after the deadline."""
    deadline = time.monotonic() + cfg.ingest_timeout_s
    last: Any = None
    while True:
        pending = await pending_jobs(http)
        done = pending == 0
        infos = []
        for sid in sids:
            info = check_response(await http.get(f"/v1/sessions/{sid}"), f"session {sid}")
            infos.append(info)
            if info["counts"]["chunks"] == 0 or info["watermark"]["level"] != "normal":
                done = False
        if done and cfg.wait_embedded:
            for sid in sids:
                chunks = await _list_chunks(http, sid)
                if not all(c["embedded"] for c in chunks if c["status"] == "active"):
                    done = False
                    last = {"session": sid, "unembedded": sum(not c["embedded"] for c in chunks)}
                    break
        if done:
            return infos
        last = last or {"pending_jobs": pending}
        if time.monotonic() > deadline:
            raise EvalError(f"sessions not ready after {cfg.ingest_timeout_s}s; last: {last}")
        await asyncio.sleep(0.5)


def _window_seqs(resp: Mapping[str, Any]) -> set[int]:
    return {
        int(e["id"].removeprefix("turn:"))
        for e in resp["manifest"]
        if e["layer"] == "c1" and e["included"] and e["id"].startswith("turn:")
    }


def _item_dias(resp: Mapping[str, Any], seq_to_dia: Mapping[int, str]) -> list[set[str]]:
    units = []
    for item in resp["recall"]["items"]:
        rng, shown = item.get("turn_range"), item.get("turns")
        if shown is not None:  # cut down to some turns of its range: only those are in the prompt
            units.append({seq_to_dia[s] for s in shown if s in seq_to_dia})
        else:
            units.append(dia_ids_of_range(rng[0], rng[1], seq_to_dia) if rng else set())
    return units


async def _build(
    http: Any, sid: str, body: dict[str, Any]
) -> tuple[dict[str, Any] | None, float, int]:
    """One build-prompt; a 5xx or a dropped connection is returned as None (a failed build)."""
    import httpx

    started = time.perf_counter()
    try:
        resp = await http.post(f"/v1/sessions/{sid}/build-prompt", json=body)
    except httpx.TransportError:
        return None, (time.perf_counter() - started) * 1000, 0
    wall = (time.perf_counter() - started) * 1000
    if resp.status_code >= 500:
        return None, wall, resp.status_code
    return check_response(resp, f"build-prompt {sid}"), wall, resp.status_code


async def _evaluate_question(
    http: Any,
    cfg: EvalConfig,
    conv: Conversation,
    sid: str,
    seq_to_dia: Mapping[int, str],
    q: Question,
    builds: list[BuildSample],
    tool_calls: list[BuildSample],
    answering: "AnswerPass | None" = None,
) -> tuple[QuestionResult, QuestionResult | None]:
    r = QuestionResult(conv.sample_id, q.category, len(q.evidence))
    tool = QuestionResult(conv.sample_id, q.category, len(q.evidence)) if cfg.memory_tool else None
    at_answer_budget: dict[str, Any] | None = None
    for b in cfg.budgets:
        resp, wall, status = await _build(http, sid, _budget_body(cfg, q, b))
        if b == cfg.answer_budget:
            at_answer_budget = resp
        if resp is None:
            r.budget_recall[b] = r.budget_recall_recalled_only[b] = 0.0
            r.injected[b] = 0
            builds.append(BuildSample(b, wall, {}, [f"http_{status or 'dropped'}"], 0, 0, True))
            continue
        window = set().union(*[dia_ids_of_range(s, s, seq_to_dia) for s in _window_seqs(resp)])
        if tool is not None:
            await _tool_recall(http, cfg, sid, seq_to_dia, q, b, window, tool, tool_calls)
        recalled = set().union(*_item_dias(resp, seq_to_dia))
        r.in_window = coverage(q.evidence, window)
        r.budget_recall[b] = coverage(q.evidence, recalled | window)
        r.budget_recall_recalled_only[b] = coverage(q.evidence, recalled)
        r.injected[b] = int(resp["usage"]["recall"])
        builds.append(
            BuildSample(
                budget=b,
                wall_ms=wall,
                timings_ms=dict(resp.get("timings_ms") or {}),
                fallbacks=list(resp.get("fallbacks") or []),
                injected=int(resp["usage"]["recall"]),
                items=len(resp["recall"]["items"]),
            )
        )
    if cfg.ks:
        ranking_body = {
            "query": q.question,
            "context_limit": RANKING_LIMIT,
            "reserve_tokens": 0,
            "recall": {"mode": "always", "budget_tokens": RANKING_LIMIT, "top_k": cfg.top_k},
        }
        resp, _, _ = await _build(http, sid, ranking_body)
        units = _item_dias(resp, seq_to_dia) if resp is not None else []
        for k in cfg.ks:
            r.at_k[k] = recall_at_k(q.evidence, units, k)
    if answering is not None:
        if cfg.answer_budget not in cfg.budgets:
            at_answer_budget, _, _ = await _build(
                http, sid, _budget_body(cfg, q, cfg.answer_budget)
            )
        await _answer(answering, cfg, conv, seq_to_dia, q, at_answer_budget)
    return r, tool


def _budget_body(cfg: EvalConfig, q: Question, budget: int) -> dict[str, Any]:
    return {
        "query": q.question,
        "recall": {"mode": "always", "budget_tokens": budget, "top_k": cfg.top_k},
    }


@dataclass
class AnswerPass:
    """The answering model's client (None: `--ablate` without a model), and what `--answer-llm`
    and `--ablate` collect."""

    llm: Any
    answers: list[AnswerResult] = field(default_factory=list)
    ablations: list[AblationResult] = field(default_factory=list)
    lines: dict[str, dict[int, str]] = field(default_factory=dict)  # sample id → `shown_lines`


async def _answer(
    answering: AnswerPass,
    cfg: EvalConfig,
    conv: Conversation,
    seq_to_dia: Mapping[int, str],
    q: Question,
    resp: Mapping[str, Any] | None,
) -> None:
    """Answer and take apart the build at the answer budget. A failed build (a server error,
    counted among the builds) is a wrong answer with its error, and has nothing to take apart."""
    if resp is None:
        if cfg.answering is not None and q.category in SCORED_CATEGORIES:
            answering.answers.append(
                AnswerResult(conv.sample_id, q.category, q.question, q.answer, "", False, False,
                             "build-prompt failed", 0.0, 0, 0)
            )  # fmt: skip
        return
    ids = [item["chunk_id"] for item in resp["recall"]["items"]]
    units = dict(zip(ids, _item_dias(resp, seq_to_dia), strict=True))
    window = set().union(*[dia_ids_of_range(s, s, seq_to_dia) for s in _window_seqs(resp)])
    if conv.sample_id not in answering.lines:
        answering.lines[conv.sample_id] = shown_lines(conv, seq_to_dia)
    lines = answering.lines[conv.sample_id]
    answer, ablation = await answer_and_ablate(
        answering.llm, cfg.answering, cfg.ablate, conv, q, resp, units, window, lines
    )
    if answer is not None:
        answering.answers.append(answer)
    if ablation is not None:
        answering.ablations.append(ablation)


def _match_dias(match: Mapping[str, Any], seq_to_dia: Mapping[int, str]) -> set[str]:
    """The dia_ids a memory tool match quotes: its shown turns, or its whole turn range."""
    shown = match.get("turns")
    if shown is not None:
        return {seq_to_dia[s] for s in shown if s in seq_to_dia}
    if match.get("turn_first") is None:
        return set()
    return dia_ids_of_range(int(match["turn_first"]), int(match["turn_last"]), seq_to_dia)


async def _tool_recall(
    http: Any,
    cfg: EvalConfig,
    sid: str,
    seq_to_dia: Mapping[int, str],
    q: Question,
    budget: int,
    window: set[str],
    result: QuestionResult,
    calls: list[BuildSample],
) -> None:
    """The memory tool's `recall` of the question at `budget`, scored like a build: its matches
    or the window (`window`: the dia_ids a build at this budget kept in C1, which the agent's
    prompt holds too); its tokens are those of the answer's text, as the agent reads it."""
    import httpx

    body = {"type": "recall", "query": q.question, "top_k": cfg.top_k, "budget_tokens": budget}
    started = time.perf_counter()
    try:
        resp = await http.post(f"/v1/sessions/{sid}/memory", json=body)
    except httpx.TransportError:
        resp = None
    wall = (time.perf_counter() - started) * 1000
    if resp is None or resp.status_code >= 500:
        status = resp.status_code if resp is not None else "dropped"
        result.budget_recall[budget] = result.budget_recall_recalled_only[budget] = 0.0
        result.injected[budget] = 0
        calls.append(BuildSample(budget, wall, {}, [f"http_{status}"], 0, 0, True))
        return
    out = check_response(resp, f"memory recall {sid}")
    matches = out["data"]["matches"]
    recalled = set().union(*(_match_dias(m, seq_to_dia) for m in matches))
    tokens = count_tokens(out["text"])
    result.in_window = coverage(q.evidence, window)
    result.budget_recall[budget] = coverage(q.evidence, recalled | window)
    result.budget_recall_recalled_only[budget] = coverage(q.evidence, recalled)
    result.injected[budget] = tokens
    fallbacks = list(out["data"].get("fallbacks") or [])
    calls.append(BuildSample(budget, wall, {}, fallbacks, tokens, len(matches)))


def _questions(conv: Conversation, cfg: EvalConfig) -> list[Question]:
    """The questions of `conv` that the run asks: with evidence, in the chosen categories."""
    return [q for q in conv.questions if q.evidence and q.category in cfg.categories]


async def run_locomo(
    conversations: Sequence[Conversation], cfg: EvalConfig, *, log: Any = say
) -> LocomoRun:
    started = time.monotonic()
    connections = max(4, cfg.concurrency * 2)
    async with (
        server_client(cfg.url, cfg.api_key, connections=connections) as http,
        AsyncExitStack() as stack,
    ):
        check_response(await http.get("/healthz"), "healthz")
        answering = None
        if cfg.answering is not None or cfg.ablate:
            llm = await stack.enter_async_context(llm_client()) if cfg.answering else None
            answering = AnswerPass(llm)
        ingested: list[tuple[Conversation, str, dict[int, str], float]] = []
        appending = Progress("turns appended", sum(len(c.turns) for c in conversations))
        for conv in conversations:
            t0 = time.monotonic()
            if cfg.reuse_run_id:
                sid, seq_to_dia = await _mapped_session(http, cfg, conv, cfg.reuse_run_id)
            else:
                sid, seq_to_dia = await _ingest(http, cfg, conv, appending)
            ingested.append((conv, sid, seq_to_dia, time.monotonic() - t0))
            log(f"{'reused' if cfg.reuse_run_id else 'ingested'} {conv.sample_id}: "
                f"{len(conv.turns)} turns → session {sid}")  # fmt: skip
        t0 = time.monotonic()
        await _wait_ready(http, cfg, [sid for _, sid, _, _ in ingested])
        ready_s = time.monotonic() - t0
        log(f"offload{' and embedding' if cfg.wait_embedded else ''} done in {ready_s:.1f}s")

        runs: list[ConversationRun] = []
        results: list[QuestionResult] = []
        tool_results: list[QuestionResult] = []
        builds: list[BuildSample] = []
        tool_calls: list[BuildSample] = []
        semaphore = asyncio.Semaphore(cfg.concurrency)
        asked = Progress(
            "questions asked",
            sum(len(_questions(conv, cfg)) for conv, _, _, _ in ingested),
        )
        for conv, sid, seq_to_dia, ingest_s in ingested:
            chunks = [c for c in await _list_chunks(http, sid) if c["status"] == "active"]
            info = check_response(await http.get(f"/v1/sessions/{sid}"), f"session {sid}")
            questions = _questions(conv, cfg)

            async def one(q: Question, sid: str = sid, conv: Conversation = conv,
                          m: dict[int, str] = seq_to_dia,
                          ) -> tuple[QuestionResult, QuestionResult | None]:  # fmt: skip
                async with semaphore:
                    result = await _evaluate_question(
                        http, cfg, conv, sid, m, q, builds, tool_calls, answering
                    )
                asked.advance()
                return result

            for result, tool in await asyncio.gather(*(one(q) for q in questions)):
                results.append(result)
                if tool is not None:
                    tool_results.append(tool)
            offloaded = sum(c["turn_last"] - c["turn_first"] + 1 for c in chunks)
            runs.append(
                ConversationRun(
                    sample_id=conv.sample_id,
                    session_id=sid,
                    turns=len(conv.turns),
                    chunks=len(chunks),
                    chunk_tokens_mean=(
                        statistics.fmean(c["token_count"] for c in chunks) if chunks else 0.0
                    ),
                    window_turns=info["counts"]["turns"] - offloaded,
                    ingest_s=ingest_s,
                    ready_s=ready_s,
                )
            )
            log(f"evaluated {conv.sample_id}: {len(questions)} questions")

    bm25: list[QuestionResult] = []
    bm25_framed: list[QuestionResult] = []
    truncation: list[QuestionResult] = []
    for conv in conversations:
        bm25.extend(bm25_baseline(conv, cfg.budgets, cfg.ks))
        bm25_framed.extend(
            bm25_baseline(
                conv, cfg.budgets, (), framed=True, per_item_max_tokens=cfg.per_item_max_tokens
            )
        )
        truncation.extend(truncation_baseline(conv, cfg.context_limit - cfg.reserve_tokens))
    dropped = [
        (conv.sample_id, ", ".join(q.raw_evidence), part)
        for conv in conversations
        for q in conv.questions
        for part in q.dropped
    ]
    return LocomoRun(
        config=cfg,
        conversations=runs,
        contextd=results,
        bm25=bm25,
        bm25_framed=bm25_framed,
        truncation=truncation,
        builds=builds,
        tool=tool_results,
        tool_calls=tool_calls,
        evidence_dropped=dropped,
        questions_without_evidence=sum(
            1 for conv in conversations for q in conv.questions if not q.evidence
        ),
        elapsed_s=time.monotonic() - started,
        answers=answering.answers if answering is not None else [],
        ablations=answering.ablations if answering is not None else [],
    )
