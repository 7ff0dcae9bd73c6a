"""The MADial-Bench driver: talks to a *running* contextd over HTTP only (remember each memory,
append each dialogue to a fresh session of its user, one memory `recall` per dialogue), then
scores with `app.eval.madial`."""

import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.core.progress import Progress, say
from app.eval.answering import MADIAL_REPLY, AnswerSetup, grade, llm_client, prompt_text
from app.eval.driver import check_response, server_client, wait_for_jobs
from app.eval.locomo import percentile
from app.eval.madial import (
    DialogueResult,
    Lang,
    MadialDialogue,
    MadialMemory,
    bm25_madial,
    ranked_units,
    recall_at,
)


@dataclass
class MadialReply:
    """A dialogue's next assistant turn written by the reply model from the build, judged
    against the dataset's reply at the test turn."""

    index: int
    question: str  # the user's last line, the build's query
    gold: str
    answer: str
    published: bool
    strict: bool
    error: str | None
    prompt_tokens: int  # `usage.total` of the build
    memory_tokens: int  # `usage.c2`: the notes and the user-memory block


# `remember` is rate-limited per session (20 a minute by default): each user's memories are
# stored through several sessions of that user, this many each.
MEMORIES_PER_LOADER_SESSION = 15


@dataclass
class MadialConfig:
    url: str
    lang: Lang
    api_key: str | None = None
    ks: tuple[int, ...] = (5, 10)
    timeout_s: float = 600.0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    answering: AnswerSetup | None = None  # `--answer-llm`: reply to each dialogue, judged
    answer_budget: int = 1000  # the recall budget of the build the reply model reads


@dataclass
class MadialRun:
    config: MadialConfig
    contextd: list[DialogueResult]
    bm25: list[DialogueResult]
    memories: int
    stored_items: int  # remembered items created (near-duplicates share one)
    deduplicated: list[tuple[str, str]]  # (dataset id, the dataset id whose item it reuses)
    remember_s: float
    recall_ms: list[float]
    elapsed_s: float
    replies: list[MadialReply] = field(default_factory=list)  # with `answering`


async def _remember_all(
    http: Any, cfg: MadialConfig, memories: Sequence[MadialMemory]
) -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
    """Store every memory as a user-scope remembered item (its scene and emotion as the item's
    tags); memory_id → dataset ids."""
    stored: dict[str, list[str]] = {}
    deduplicated: list[tuple[str, str]] = []
    by_user: dict[str, list[MadialMemory]] = {}
    for m in memories:
        by_user.setdefault(m.user, []).append(m)
    for user, pool in by_user.items():
        for start in range(0, len(pool), MEMORIES_PER_LOADER_SESSION):
            sid = f"madial-{cfg.lang}-{cfg.run_id}-u{user}-load{start}"
            check_response(
                await http.put(f"/v1/sessions/{sid}", json={"user_id": _user_id(cfg, user)}),
                f"configure {sid}",
            )
            for m in pool[start : start + MEMORIES_PER_LOADER_SESSION]:
                body = {"type": "remember", "text": m.text, "scope": "user", "tags": m.tags}
                out = check_response(
                    await http.post(f"/v1/sessions/{sid}/memory", json=body), f"remember {m.id}"
                )
                memory_id = str(out["data"]["memory_id"])
                if memory_id in stored:
                    deduplicated.append((m.id, stored[memory_id][0]))
                stored.setdefault(memory_id, []).append(m.id)
    return stored, deduplicated


def _user_id(cfg: MadialConfig, user: str) -> str:
    return f"madial-{cfg.lang}-{cfg.run_id}-user{user}"


async def _ask(
    http: Any, cfg: MadialConfig, d: MadialDialogue, stored: dict[str, list[str]]
) -> tuple[DialogueResult, float]:
    sid = f"madial-{cfg.lang}-{cfg.run_id}-d{d.index}"
    check_response(
        await http.put(f"/v1/sessions/{sid}", json={"user_id": _user_id(cfg, d.user)}),
        f"configure {sid}",
    )
    # Each dialogue is an independent probe of the stored memories: its own lines stay off the
    # record, or what its user says ("I love apple juice!") would become user memory that the
    # next probes of that user recall, scored as misses.
    turns = [
        {"role": line.role, "content": line.text, "metadata": {"remember": False}}
        for line in d.lines
    ]
    check_response(await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns}), "append")
    body = {"type": "recall", "query": d.query, "top_k": max(cfg.ks)}
    started = time.perf_counter()
    out = check_response(await http.post(f"/v1/sessions/{sid}/memory", json=body), "recall")
    wall = (time.perf_counter() - started) * 1000
    units = ranked_units(out["data"]["matches"], stored)
    result = DialogueResult(
        d.index,
        d.user,
        len(d.relevant),
        returned=len(units),
        latency_ms=wall,
        fallbacks=tuple(out["data"].get("fallbacks") or ()),
    )
    result.at_k = {k: recall_at(d.relevant, units, k) for k in cfg.ks}
    return result, wall


async def run_madial(
    memories: Sequence[MadialMemory],
    dialogues: Sequence[MadialDialogue],
    cfg: MadialConfig,
    *,
    log: Any = say,
) -> MadialRun:
    started = time.monotonic()
    async with server_client(cfg.url, cfg.api_key) as http:
        check_response(await http.get("/healthz"), "healthz")
        stored, deduplicated = await _remember_all(http, cfg, memories)
        await wait_for_jobs(http, cfg.timeout_s)
        remember_s = time.monotonic() - started
        log(f"remembered {len(memories)} memories as {len(stored)} items in {remember_s:.1f}s")
        results: list[DialogueResult] = []
        walls: list[float] = []
        replies: list[MadialReply] = []
        asked = Progress("dialogues asked", len(dialogues))
        async with llm_client() as llm:
            for d in dialogues:
                result, wall = await _ask(http, cfg, d, stored)
                results.append(result)
                walls.append(wall)
                if cfg.answering is not None and d.reply:
                    reply = await _reply(http, llm, cfg, cfg.answering, d)
                    replies += [reply] if reply is not None else []
                asked.advance()
        log(f"asked {len(dialogues)} dialogues")
    return MadialRun(
        config=cfg,
        contextd=results,
        bm25=bm25_madial(memories, dialogues, cfg.ks),
        memories=len(memories),
        stored_items=len(stored),
        deduplicated=deduplicated,
        remember_s=remember_s,
        recall_ms=walls,
        elapsed_s=time.monotonic() - started,
        replies=replies,
    )


async def _reply(
    http: Any, llm: httpx.AsyncClient, cfg: MadialConfig, setup: AnswerSetup, d: MadialDialogue
) -> MadialReply | None:
    """The dialogue up to its user's last line in a fresh session of that user, a build-prompt
        with that line as the query (the user-memory block holds what recall chose of the user's
        remembered items), the reply model's next turn, both judges against the gold reply; None for
    a dialogue without a user line."""
    users = [n for n, line in enumerate(d.lines) if line.role == "user"]
    if not users:
        return None
    sid = f"madial-{cfg.lang}-{cfg.run_id}-d{d.index}-reply"
    check_response(
        await http.put(f"/v1/sessions/{sid}", json={"user_id": _user_id(cfg, d.user)}),
        f"configure {sid}",
    )
    last = users[-1]
    turns = [
        {"role": line.role, "content": line.text, "metadata": {"remember": False}}
        for line in d.lines[:last]
    ]  # off the record, as in `_ask`
    if turns:
        check_response(
            await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns}), "append"
        )
    question = d.lines[last].text
    body = {"query": question, "recall": {"mode": "always", "budget_tokens": cfg.answer_budget}}
    built = check_response(await http.post(f"/v1/sessions/{sid}/build-prompt", json=body), "build")
    graded = await grade(
        llm, setup, prompt_text(MADIAL_REPLY), built["messages"], question, d.reply
    )
    usage = built["usage"]
    return MadialReply(
        d.index,
        question,
        d.reply,
        graded.answer,
        graded.published,
        graded.strict,
        graded.error,
        int(usage["total"]),
        int(usage["c2"]),
    )


def latency_line(walls: Sequence[float]) -> str:
    if not walls:
        return "no recall calls"
    return (
        f"recall wall p50 {percentile(walls, 0.5):.1f} ms, p95 {percentile(walls, 0.95):.1f} ms, "
        f"mean {statistics.fmean(walls):.1f} ms (n={len(walls)})"
    )
