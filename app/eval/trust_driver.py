"""`contextd eval trust`: run the scenarios of `app.eval.trust` against a *running* contextd over
HTTP (a worker must run: the notes and the forgets' erase jobs are its work), then score and
write the report. The key needs `memory:offload` and `memory:forget` (or a deployment that allows
them to every key)."""

import argparse
import asyncio
import json
import os
import platform
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.core.progress import say
from app.eval.driver import check_response, server_client
from app.eval.notes_driver import _final_offload, _wait_notes
from app.eval.trust import (
    FORGETS,
    INJECTIONS,
    UPDATE_QUERY,
    UPDATES,
    ForgetCase,
    ForgetResult,
    InjectionCase,
    InjectionResult,
    TrustRun,
    UpdateResult,
    filler,
    holds,
    notes_texts,
    report,
    summarise,
    trust_table,
)
from app.memories.conflicts import contradicts
from app.notes.policy import NOTES_HEADER

# A small window with low floors, so that a final offload moves every scenario turn out of it.
_WINDOW = {
    "context_limit": 2000,
    "reserve_tokens": 200,
    "min_recent_turns": 1,
    "min_recent_tokens": 50,
    "target_ratio": 0.3,
}
_POLL_S = 0.25


@dataclass(frozen=True, slots=True)
class TrustConfig:
    url: str
    api_key: str | None = None
    timeout_s: float = 300.0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])


async def _session(http: Any, sid: str, user: str) -> None:
    body = {**_WINDOW, "user_id": user, "metadata": {"eval": "trust"}}
    check_response(await http.put(f"/v1/sessions/{sid}", json=body), f"configure {sid}")


async def _append(http: Any, sid: str, turns: Sequence[dict[str, Any]]) -> list[int]:
    out = check_response(
        await http.post(f"/v1/sessions/{sid}/turns", json={"turns": list(turns)}), f"append {sid}"
    )
    return [int(t["seq"]) for t in out["turns"]]


async def _build(http: Any, sid: str, query: str) -> dict[str, Any]:
    return dict(
        check_response(
            await http.post(f"/v1/sessions/{sid}/build-prompt", json={"query": query}),
            f"build {sid}",
        )
    )


def _prompt_text(build: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in build["messages"])


def _notes_block(build: dict[str, Any]) -> str:
    return "\n".join(
        str(m.get("content") or "")
        for m in build["messages"]
        if str(m.get("content") or "").startswith(NOTES_HEADER)
    )


async def _memory(http: Any, sid: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await http.post(f"/v1/sessions/{sid}/memory", json=body)
    return dict(check_response(resp, f"memory {body['type']} {sid}"))


def _tool_turns(case: InjectionCase) -> list[dict[str, Any]]:
    call = {"id": "call-1", "type": "function", "function": {"name": case.tool, "arguments": "{}"}}
    done = "Here is what I found." if case.language == "en" else "这是我查到的内容。"
    return [
        {"role": "user", "content": case.request},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-1", "name": case.tool, "content": case.result},
        {"role": "assistant", "content": done},
        *({"role": role, "content": text} for role, text in filler(case.language)),
    ]


async def _injections(http: Any, cfg: TrustConfig) -> list[InjectionResult]:
    sessions: list[tuple[InjectionCase, str, bool]] = []
    for case in INJECTIONS:
        sid, user = f"trust-{case.id}-{cfg.run_id}", f"trust-user-{case.id}-{cfg.run_id}"
        await _session(http, sid, user)
        seqs = await _append(http, sid, _tool_turns(case))
        build = await _build(http, sid, case.request)
        flags = {m["id"]: m.get("injection", False) for m in build["manifest"]}
        sessions.append((case, sid, bool(flags.get(f"turn:{seqs[2]}"))))
        await _final_offload(http, sid)
    pads = await _wait_notes(http, [sid for _, sid, _ in sessions], cfg.timeout_s)
    results = []
    for case, sid, flagged in sessions:
        notes = notes_texts(pads[sid].notes.model_dump())
        listed = check_response(await http.get(f"/v1/sessions/{sid}/memories"), f"memories {sid}")
        remembered = [str(m["text"]) for m in listed["memories"]]
        block = _notes_block(await _build(http, sid, case.request))
        where = [
            name
            for name, texts in (("notes", notes), ("memories", remembered), ("prompt", [block]))
            if any(holds(t, case.order) for t in texts)
        ]
        results.append(
            InjectionResult(
                case.id,
                case.language,
                intercepted=not where,
                flagged=flagged,
                data_kept=any(holds(t, case.data) for t in notes),
                where=where,
            )
        )
    return results


async def _updates(http: Any, cfg: TrustConfig, keyed: bool) -> list[UpdateResult]:
    results = []
    for language in ("en", "zh"):
        user = f"trust-{'keyed' if keyed else 'unkeyed'}-{language}-{cfg.run_id}"
        cases = [u for u in UPDATES if u.language == language]
        for n, pick in enumerate(("old", "new")):
            sid = f"{user}-s{n}"
            await _session(http, sid, user)
            for case in cases:
                body = {"type": "remember", "text": getattr(case, pick), "scope": "user"}
                await _memory(http, sid, {**body, "key": case.key} if keyed else body)
        sid = f"{user}-s2"
        await _session(http, sid, user)
        prompt = _prompt_text(await _build(http, sid, UPDATE_QUERY[language]))
        for case in cases:
            stale, current = holds(prompt, case.old_term), holds(prompt, case.new_term)
            results.append(
                UpdateResult(
                    case.id,
                    language,
                    keyed,
                    stale=stale,
                    current=current,
                    contradiction=stale and current and contradicts(case.old, case.new),
                )
            )
    return results


async def _places(http: Any, sid: str, case: ForgetCase) -> list[str]:
    """Where the forgotten values still show: notes, chunks, recall, a built prompt (404: none)."""
    found: list[str] = []
    pad = await http.get(f"/v1/sessions/{sid}/scratchpad")
    if pad.status_code != 404:
        texts = notes_texts(check_response(pad, f"scratchpad {sid}")["notes"])
        found += ["notes"] * sum(any(holds(t, v) for v in case.values) for t in texts)
    chunks = await http.get(f"/v1/sessions/{sid}/chunks")
    if chunks.status_code != 404:
        for chunk in check_response(chunks, f"chunks {sid}")["chunks"]:
            if chunk["status"] != "active":
                continue
            one = await http.get(f"/v1/sessions/{sid}/chunks/{chunk['chunk_id']}")
            if one.status_code != 404 and any(
                holds(check_response(one, "chunk")["raw_text"], v) for v in case.values
            ):
                found.append("chunk")
    recall = await http.post(
        f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": case.query}
    )
    if recall.status_code != 404:
        matches = check_response(recall, f"recall {sid}")["data"].get("matches", [])
        found += ["recall"] * sum(any(holds(m["text"], v) for v in case.values) for m in matches)
    return found


async def _prompt_places(http: Any, sid: str, case: ForgetCase) -> list[str]:
    prompt = _prompt_text(await _build(http, sid, case.query))
    return ["prompt"] if any(holds(prompt, v) for v in case.values) else []


async def _until_none(http: Any, cfg: TrustConfig, sid: str, probe: str, case: ForgetCase
                      ) -> tuple[list[str], float | None]:  # fmt: skip
    """What shows right after the forget, and the seconds until nothing does."""
    started = time.monotonic()
    first: list[str] | None = None
    while True:
        left = await _places(http, sid, case) + await _prompt_places(http, probe, case)
        first = left if first is None else first
        if not left:
            return first, time.monotonic() - started
        if time.monotonic() - started > cfg.timeout_s:
            return first, None
        await asyncio.sleep(_POLL_S)


async def _forget(http: Any, cfg: TrustConfig, case: ForgetCase, kind: str) -> ForgetResult:
    user = f"trust-forget-{kind}-{case.language}-{cfg.run_id}"
    sid = f"{user}-s0"
    await _session(http, sid, user)
    seqs = await _append(
        http, sid, [{"role": "user", "content": case.turn}, *map(_turn, filler(case.language))]
    )
    await _final_offload(http, sid)
    await _wait_notes(http, [sid], cfg.timeout_s)
    before = await _places(http, sid, case) + await _prompt_places(http, sid, case)
    if kind == "turn":
        await _memory(http, sid, {"type": "forget", "turn_range": [seqs[0], seqs[0]]})
        probe = sid
    else:
        check_response(await http.delete(f"/v1/sessions/{sid}"), f"delete {sid}")
        probe = f"{user}-s1"  # a new session of the same user
        await _session(http, probe, user)
    left, seconds = await _until_none(http, cfg, sid, probe, case)
    return ForgetResult(case.language, kind, len(before), len(left), seconds, left)


def _turn(pair: tuple[str, str]) -> dict[str, str]:
    return {"role": pair[0], "content": pair[1]}


async def run_trust_eval(cfg: TrustConfig, *, log: Any = say) -> TrustRun:
    started = time.monotonic()
    async with server_client(cfg.url, cfg.api_key) as http:
        check_response(await http.get("/healthz"), "healthz")
        injections = await _injections(http, cfg)
        log(f"injections: {len(injections)} cases")
        updates = await _updates(http, cfg, keyed=True) + await _updates(http, cfg, keyed=False)
        log(f"updates: {len(updates)} cases")
        forgets = [
            await _forget(http, cfg, case, kind) for case in FORGETS for kind in ("turn", "session")
        ]
        log(f"forgets: {len(forgets)} cases")
    return TrustRun(injections, updates, forgets, time.monotonic() - started, cfg.url, cfg.run_id)


# ---------------------------------------------------------------- command line


def add_trust_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    ev = sub.add_parser(
        "trust", help="memory trust: injected orders, updated facts, forget (English and Chinese)"
    )
    ev.add_argument("--url", default="http://127.0.0.1:8080", help="running contextd and worker")
    ev.add_argument("--api-key", default=None, help="needs memory:offload and memory:forget")
    ev.add_argument("--out", default="eval-report", help="report directory")
    ev.add_argument("--timeout", type=float, default=300.0, help="notes and erase deadline, s")
    ev.add_argument("--label", default="", help="free text shown in the report header")


def run_trust_command(args: argparse.Namespace) -> int:
    cfg = TrustConfig(url=args.url, api_key=args.api_key, timeout_s=args.timeout)
    run = asyncio.run(run_trust_eval(cfg))
    summary = summarise(run)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = [
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} · server `{cfg.url}` · machine: "
        f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()} · "
        f"run `{cfg.run_id}`, {run.elapsed_s:.0f}s{f' · {args.label}' if args.label else ''}"
    ]
    path = out / "trust_report.md"
    path.write_text(report(run, summary, header))
    (out / "trust_results.json").write_text(
        json.dumps(
            {
                "summary": summary,
                "injections": [asdict(r) for r in run.injections],
                "updates": [asdict(r) for r in run.updates],
                "forgets": [asdict(r) for r in run.forgets],
            },
            indent=1,
            ensure_ascii=False,
        )
    )
    print(trust_table(summary))
    print(f"report: {path}")
    return 0
