"""`contextd eval notes`: drive a *running* contextd over HTTP, then score with `app.eval.notes`.

Per conversation: configure a session with a small window, append every turn, ask the memory tool
to offload everything above the window floors (`offload` with `until_tokens: 0`; a key without
`memory:offload` leaves the last turns in the window, which are then counted apart), wait until
the worker has no jobs and the notes cover every offloaded turn, and read the scratchpad. The
generator is whatever the server runs (`CONTEXTD_NOTES__GENERATOR`), at the server's notes cap.
"""

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.core.progress import say
from app.eval.driver import EvalConfig, EvalError, _ingest, check_response, server_client
from app.eval.locomo import Conversation, parse_conversation
from app.eval.notes import (
    ConversationScore,
    Observation,
    ObservationScore,
    SuiteConversation,
    load_observations,
    load_suite,
    score_conversation,
    score_observations,
    suite_table,
    summarise_observations,
    summarise_suite,
    write_notes_report,
)
from app.notes.schemas import Notes

# The session settings a conversation is configured with (the LoCoMo ingest sets the same).
_WINDOW_SETTINGS = (
    "context_limit",
    "reserve_tokens",
    "min_recent_turns",
    "min_recent_tokens",
    "target_ratio",
)


@dataclass
class NotesRun:
    config: EvalConfig
    generators: list[str]
    suite: list[ConversationScore]
    observations: list[ObservationScore]
    offload_refused: int  # sessions whose key could not ask for the final offload
    elapsed_s: float


@dataclass
class _Pad:
    notes: Notes
    covers_until_seq: int
    token_count: int
    dropped_items: int
    generator: str


async def _final_offload(http: Any, sid: str) -> bool:
    """Everything above the window floors out; False when the key may not offload."""
    resp = await http.post(
        f"/v1/sessions/{sid}/memory", json={"type": "offload", "until_tokens": 0}
    )
    if resp.status_code == 403:
        return False
    check_response(resp, f"offload {sid}")
    return True


async def _wait_notes(http: Any, sids: Sequence[str], timeout_s: float) -> dict[str, _Pad]:
    """Poll until no job is pending and every session's notes cover its offloaded turns."""
    deadline = time.monotonic() + timeout_s
    while True:
        ready = (await http.get("/readyz")).json()  # 503 (worker lag) still reports the queue
        pending = int((ready.get("worker") or {}).get("pending_jobs", 0))
        pads: dict[str, _Pad] = {}
        fresh = pending == 0
        for sid in sids:
            pad = check_response(
                await http.get(f"/v1/sessions/{sid}/scratchpad"), f"scratchpad {sid}"
            )
            fresh = fresh and not pad["stale"] and not pad["rebuild_pending"]
            pads[sid] = _Pad(
                notes=Notes.model_validate(pad["notes"]),
                covers_until_seq=int(pad["covers_until_seq"]),
                token_count=int(pad["token_count"]),
                dropped_items=int(pad["dropped_items"]),
                generator=str(pad["generator"]),
            )
        if fresh:
            return pads
        if time.monotonic() > deadline:
            raise EvalError(f"notes not fresh after {timeout_s}s ({pending} jobs pending)")
        await asyncio.sleep(0.5)


async def _ingest_suite(http: Any, cfg: EvalConfig, conv: SuiteConversation) -> list[int]:
    sid = f"notes-{conv.id}-{cfg.run_id}"
    check_response(
        await http.put(
            f"/v1/sessions/{sid}",
            json={
                **{name: getattr(cfg, name) for name in _WINDOW_SETTINGS},
                "metadata": {"eval": "notes", "conversation": conv.id},
            },
        ),
        f"configure {sid}",
    )
    seqs: list[int] = []
    for start in range(0, len(conv.turns), 100):
        batch = conv.turns[start : start + 100]
        body = {"turns": [{"role": t.role, "content": t.content} for t in batch]}
        out = check_response(
            await http.post(f"/v1/sessions/{sid}/turns", json=body), f"append {sid}"
        )
        seqs.extend(int(t["seq"]) for t in out["turns"])
    return seqs


async def run_notes_eval(
    suite: Sequence[SuiteConversation],
    locomo: Sequence[tuple[Conversation, list[Observation]]],
    cfg: EvalConfig,
    *,
    log: Any = say,
) -> NotesRun:
    started = time.monotonic()
    async with server_client(cfg.url, cfg.api_key) as http:
        check_response(await http.get("/healthz"), "healthz")
        sessions: list[tuple[str, SuiteConversation, list[int]]] = []
        for conv in suite:
            seqs = await _ingest_suite(http, cfg, conv)
            sessions.append((f"notes-{conv.id}-{cfg.run_id}", conv, seqs))
            log(f"ingested {conv.id}: {len(conv.turns)} turns")
        ingested: list[tuple[str, Conversation, list[Observation], dict[int, str]]] = []
        for sample, observations in locomo:
            sid, seq_to_dia = await _ingest(http, cfg, sample)
            ingested.append((sid, sample, observations, seq_to_dia))
            log(f"ingested LoCoMo {sample.sample_id}: {len(sample.turns)} turns")
        sids = [sid for sid, _, _ in sessions] + [sid for sid, _, _, _ in ingested]
        refused = 0
        for sid in sids:
            refused += not await _final_offload(http, sid)
        pads = await _wait_notes(http, sids, cfg.ingest_timeout_s)
        log(f"notes fresh for {len(sids)} sessions")

    scores = [
        score_conversation(
            conv,
            pads[sid].notes,
            seqs,
            pads[sid].covers_until_seq,
            token_count=pads[sid].token_count,
            dropped_items=pads[sid].dropped_items,
        )
        for sid, conv, seqs in sessions
    ]
    observed = []
    for sid, sample, observations, seq_to_dia in ingested:
        roles = {
            t.speaker: "user" if t.speaker == sample.speaker_a else "assistant"
            for t in sample.turns
        }
        observed.append(
            score_observations(
                sample.sample_id,
                observations,
                roles,
                pads[sid].notes,
                seq_to_dia,
                token_count=pads[sid].token_count,
                dropped_items=pads[sid].dropped_items,
            )
        )
    return NotesRun(
        config=cfg,
        generators=sorted({pad.generator for pad in pads.values()}),
        suite=scores,
        observations=observed,
        offload_refused=refused,
        elapsed_s=time.monotonic() - started,
    )


# ---------------------------------------------------------------- command line


def add_notes_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    ev = sub.add_parser(
        "notes", help="notes quality: scripted must-keep suite and LoCoMo observations"
    )
    ev.add_argument("--suite", required=True, help="suite JSON (python -m tests.eval.notes_suite)")
    ev.add_argument("--locomo", default=None, help="a LoCoMo JSON file (observations reference)")
    ev.add_argument("--url", default="http://127.0.0.1:8080", help="running contextd")
    ev.add_argument("--api-key", default=None, help="needs memory:offload for the final offload")
    ev.add_argument("--out", default="eval-report", help="report directory")
    ev.add_argument("--conversations", type=int, default=None, help="per part and language")
    ev.add_argument("--locomo-conversations", type=int, default=None, help="first N of LoCoMo")
    ev.add_argument("--context-limit", type=int, default=2000)
    ev.add_argument("--reserve-tokens", type=int, default=200)
    ev.add_argument("--timeout", type=float, default=600.0, help="notes freshness deadline, s")
    ev.add_argument("--label", default="", help="free text shown in the report header")


def run_notes_command(args: argparse.Namespace) -> int:
    suite = load_suite(args.suite, args.conversations)
    locomo: list[tuple[Conversation, list[Observation]]] = []
    if args.locomo:
        samples = json.loads(Path(args.locomo).read_text())[: args.locomo_conversations]
        for sample in samples:
            conv = parse_conversation(sample)
            locomo.append((conv, load_observations(sample, (t.dia_id for t in conv.turns))))
    cfg = EvalConfig(
        url=args.url,
        api_key=args.api_key,
        context_limit=args.context_limit,
        reserve_tokens=args.reserve_tokens,
        min_recent_tokens=100,
        target_ratio=0.3,
        ingest_timeout_s=args.timeout,
    )
    result = asyncio.run(run_notes_eval(suite, locomo, cfg))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise_suite(result.suite)
    observations = summarise_observations(result.observations)
    path = write_notes_report(
        out,
        summary,
        observations,
        result.suite,
        result.observations,
        generators=result.generators,
        sources=(args.suite, args.locomo),
        label=args.label,
        offload_refused=result.offload_refused,
        elapsed_s=result.elapsed_s,
    )
    (out / "notes_results.json").write_text(
        json.dumps(
            {
                "generators": result.generators,
                "suite": summary,
                "observations": observations,
                "conversations": [asdict(s) for s in result.suite],
                "locomo": [asdict(s) for s in result.observations],
            },
            indent=1,
            ensure_ascii=False,
        )
    )
    print(suite_table(summary))
    print(f"report: {path}")
    return 0
