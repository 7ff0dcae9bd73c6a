"""The MADial-Bench driver: talks to a *running* contextd over HTTP only (remember each memory,
append each dialogue to a fresh session of its user, one memory `recall` per dialogue), then
scores with `app.eval.madial`."""

import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.progress import Progress, say
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
    turns = [{"role": line.role, "content": line.text} for line in d.lines]
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
        asked = Progress("dialogues asked", len(dialogues))
        for d in dialogues:
            result, wall = await _ask(http, cfg, d, stored)
            results.append(result)
            walls.append(wall)
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
    )


def latency_line(walls: Sequence[float]) -> str:
    if not walls:
        return "no recall calls"
    return (
        f"recall wall p50 {percentile(walls, 0.5):.1f} ms, p95 {percentile(walls, 0.95):.1f} ms, "
        f"mean {statistics.fmean(walls):.1f} ms (n={len(walls)})"
    )
