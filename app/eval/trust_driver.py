"""`contextd eval trust`: run the scenarios of `app.eval.trust` against a *running* contextd over
HTTP (a worker must run: the notes and the forgets' erase jobs are its work), then score and
write the report. The key needs `memory:offload` and `memory:forget` (or a deployment that allows
them to every key). The revocation, expiry and budget scenarios are in
`app.eval.trust_revocation`."""

import argparse
import asyncio
import json
import os
import platform
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.core.progress import say
from app.eval.driver import check_response, server_client
from app.eval.notes_driver import _final_offload, _wait_notes
from app.eval.trust import (
    BUDGETS,
    EXPIRIES,
    INJECTIONS,
    REVOCATION_KINDS,
    REVOCATIONS,
    UPDATE_QUERY,
    UPDATES,
    InjectionCase,
    InjectionResult,
    TrustRun,
    UpdateResult,
    holds,
    notes_texts,
    report,
    summarise,
    trust_table,
)
from app.eval.trust_http import (
    TrustConfig,
    append,
    build,
    configure,
    memory_call,
    notes_block,
    prompt_text,
    tool_turns,
)
from app.eval.trust_revocation import budget, expiry, revocation
from app.memories.conflicts import contradicts


async def _injections(http: Any, cfg: TrustConfig) -> list[InjectionResult]:
    sessions: list[tuple[InjectionCase, str, bool]] = []
    for case in INJECTIONS:
        sid, user = f"trust-{case.id}-{cfg.run_id}", f"trust-user-{case.id}-{cfg.run_id}"
        await configure(http, sid, user)
        seqs = await append(
            http, sid, tool_turns(case.language, case.request, case.tool, case.result)
        )
        built = await build(http, sid, case.request)
        flags = {m["id"]: m.get("injection", False) for m in built["manifest"]}
        sessions.append((case, sid, bool(flags.get(f"turn:{seqs[2]}"))))
        await _final_offload(http, sid)
    pads = await _wait_notes(http, [sid for _, sid, _ in sessions], cfg.timeout_s)
    results = []
    for case, sid, flagged in sessions:
        notes = notes_texts(pads[sid].notes.model_dump())
        listed = check_response(await http.get(f"/v1/sessions/{sid}/memories"), f"memories {sid}")
        remembered = [str(m["text"]) for m in listed["memories"]]
        block = notes_block(await build(http, sid, case.request))
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
            await configure(http, sid, user)
            for case in cases:
                body = {"type": "remember", "text": getattr(case, pick), "scope": "user"}
                await memory_call(http, sid, {**body, "key": case.key} if keyed else body)
        sid = f"{user}-s2"
        await configure(http, sid, user)
        prompt = prompt_text(await build(http, sid, UPDATE_QUERY[language]))
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


async def run_trust_eval(cfg: TrustConfig, *, log: Any = say) -> TrustRun:
    started = time.monotonic()
    async with server_client(cfg.url, cfg.api_key) as http:
        check_response(await http.get("/healthz"), "healthz")
        injections = await _injections(http, cfg)
        log(f"injections: {len(injections)} cases")
        updates = await _updates(http, cfg, keyed=True) + await _updates(http, cfg, keyed=False)
        log(f"updates: {len(updates)} cases")
        revocations = [
            await revocation(http, cfg, case, kind)
            for case in REVOCATIONS
            for kind in REVOCATION_KINDS
        ]
        log(f"revocations: {len(revocations)} cases")
        expiries = [await expiry(http, cfg, case) for case in EXPIRIES]
        budgets = [r for case in BUDGETS for r in await budget(http, cfg, case)]
        log(f"expiries: {len(expiries)}, tiny-budget builds: {len(budgets)}")
    return TrustRun(
        injections,
        updates,
        revocations,
        expiries,
        budgets,
        time.monotonic() - started,
        cfg.url,
        cfg.run_id,
    )


# ---------------------------------------------------------------- command line


def add_trust_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    ev = sub.add_parser(
        "trust",
        help="memory trust: injected orders, updated facts, revocation of each kind, expiry, "
        "tiny budgets (English and Chinese)",
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
                "revocations": [asdict(r) for r in run.revocations],
                "expiries": [asdict(r) for r in run.expiries],
                "budgets": [asdict(r) for r in run.budgets],
            },
            indent=1,
            ensure_ascii=False,
        )
    )
    print(trust_table(summary))
    print(f"report: {path}")
    return 0
