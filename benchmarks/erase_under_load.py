"""User and session erases while the sessions are appended to and offloaded.

    CONTEXTD_EMBEDDING__KIND=none .venv/bin/python -m benchmarks.erase_under_load \\
        [--users 100] [--sessions-per-user 2] [--sessions 100] [--erasers 4] [--appenders 6] \\
        [--offloaders 2] [--bystanders 4] [--seed 7]

A `contextd dev --auth` (the API and its worker, default settings; embeddings as the
environment says) on an embedded stack of its own. Prepared: `--users` users with
`--sessions-per-user` sessions each (turns, and a user-scope remembered item), `--sessions`
sessions of their own, `--bystanders` sessions of another user; small windows, so that a few
appends take a session over its watermark (the worker's offload) and to the emergency ratio (the
append's inline offload). Once the worker has done the jobs the preparation queued, all at
once: `--appenders` clients append two turns at a time and `--offloaders` clients call the
memory tool's `offload`, both on the sessions about to be erased and on the bystanders;
`--erasers` clients run the user erases and session erases in a shuffled order; the worker's
sweep is enqueued every 5 s (it recounts counters of sessions changed in the last minutes, and
logs each repair).

Printed: the answers of the erases, appends and offloads by status class (5xx are failures),
how long the erase requests took to answer (a small session is erased in its request), the
machine's load average while erasing, receipt completion (the receipt's `completed_at` minus
the moment its erase request was sent, one clock) median / p95 / max for user and session
erases, the bystanders' acknowledged turns missing afterwards, counter repairs the sweep logged
(nothing corrupts counters here: every one is false), deadlocks PostgreSQL logged, and
transaction retries contextd logged.
"""

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import create_async_engine

from app.auth.service import create_key
from app.core.config import to_sqlalchemy_url
from app.core.db import create_sessionmaker, unit_of_work
from app.domain.callers import ALL_SCOPES
from app.jobs.queue import TaskName, enqueue
from benchmarks.build_prompt_latency import percentile
from benchmarks.floor_compare import contextd_dev

SMALL = {
    "context_limit": 2500,
    "reserve_tokens": 200,
    "min_recent_turns": 2,
    "min_recent_tokens": 60,
}
SWEEP_EVERY_SECONDS = 5.0
HOT_TARGETS = 8  # the load runs on the sessions of the next targets to be erased


def turn(i: int, words: str) -> dict[str, str]:
    return {
        "role": "user" if i % 2 == 0 else "assistant",
        "content": f"turn {i}: {words} we compare trains, hotels and flights; option {i} "
        "looks fine, but let us keep looking. " * 3,
    }


@dataclass
class Target:
    kind: str  # "user" | "session"
    name: str
    sessions: list[str]


@dataclass
class Tally:
    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    completion: dict[str, list[float]] = field(default_factory=dict)
    receipts: list[tuple[str, str, float]] = field(default_factory=list)  # kind, id, sent at
    answered: dict[str, list[float]] = field(default_factory=dict)  # erase request seconds
    load: list[float] = field(default_factory=list)  # 1-minute load average, while erasing
    acknowledged: dict[str, dict[int, str]] = field(default_factory=dict)

    def count(self, what: str, status: int) -> None:
        self.statuses.setdefault(what, Counter())[status] += 1


async def admin_key(database_url: str) -> str:
    engine = create_async_engine(to_sqlalchemy_url(database_url))
    try:
        async with unit_of_work(create_sessionmaker(engine)) as db:
            key, _ = await create_key(db, "erase-bench", [s.value for s in ALL_SCOPES])
    finally:
        await engine.dispose()
    return key


async def prepare(http: httpx.AsyncClient, sid: str, user: str | None, remember: bool) -> None:
    config = {**SMALL, "user_id": user} if user else SMALL
    (await http.put(f"/v1/sessions/{sid}", json=config)).raise_for_status()
    turns = [turn(i, f"prepared {sid}") for i in range(6)]
    (await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).raise_for_status()
    if remember:
        body = {"type": "remember", "text": f"Locker of {user} is 4411", "scope": "user"}
        (await http.post(f"/v1/sessions/{sid}/memory", json=body)).raise_for_status()


async def worker_idle(http: httpx.AsyncClient) -> bool:
    worker = (await http.get("/readyz")).json().get("worker", {})
    return worker.get("pending_jobs", 1) == 0 and worker.get("running_jobs", 1) == 0


async def in_batches(jobs: list[Any], size: int) -> None:
    for start in range(0, len(jobs), size):
        await asyncio.gather(*jobs[start : start + size])


async def run(base: str, database_url: str, log: Path, pg_log: Path, args: Any) -> None:
    rng = random.Random(args.seed)
    key = await admin_key(database_url)
    tally = Tally()
    targets = [
        Target("user", f"u{i}", [f"u{i}-s{j}" for j in range(args.sessions_per_user)])
        for i in range(args.users)
    ] + [Target("session", f"single-{i}", [f"single-{i}"]) for i in range(args.sessions)]
    rng.shuffle(targets)
    bystanders = [f"bystander-{i}" for i in range(args.bystanders)]
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(
        base_url=base, headers=headers, timeout=120, limits=limits
    ) as http:
        started = time.monotonic()
        while (await http.get("/readyz")).json().get("worker", {}).get("live_workers", 0) < 1:
            await asyncio.sleep(0.5)  # the worker process of `contextd dev` is still starting
        print(f"worker up after {time.monotonic() - started:.0f} s", flush=True)
        started = time.monotonic()
        await in_batches(
            [
                prepare(
                    http, sid, t.name if t.kind == "user" else None, j == 0 and t.kind == "user"
                )
                for t in targets
                for j, sid in enumerate(t.sessions)
            ]
            + [prepare(http, sid, "bystander", False) for sid in bystanders],
            8,
        )
        print(
            f"prepared {sum(len(t.sessions) for t in targets)} sessions in "
            f"{time.monotonic() - started:.0f} s",
            flush=True,
        )

        # The preparation queued a notes refresh per session (and per remembered item, of the
        # user's sessions): the measured phase starts once the worker has done them.
        started = time.monotonic()
        while not await worker_idle(http):
            await asyncio.sleep(1)
        print(f"worker idle after {time.monotonic() - started:.0f} s", flush=True)

        done = asyncio.Event()
        progress = [0]  # targets whose erase was sent

        def hot_session() -> str:
            window = targets[progress[0] : progress[0] + HOT_TARGETS]
            pool = [sid for t in window for sid in t.sessions] + bystanders
            return rng.choice(pool)

        async def appender(n: int) -> None:
            i = 1000 * n
            while not done.is_set():
                sid = hot_session()
                sent = [turn(i, "load"), turn(i + 1, "load")]
                resp = await http.post(f"/v1/sessions/{sid}/turns", json={"turns": sent})
                tally.count("append", resp.status_code)
                if resp.status_code == 201 and sid in bystanders:
                    seqs = [t["seq"] for t in resp.json()["turns"]]
                    acked = tally.acknowledged.setdefault(sid, {})
                    acked.update({seq: t["content"] for seq, t in zip(seqs, sent, strict=True)})
                i += 2

        async def offloader() -> None:
            while not done.is_set():
                body = {"type": "offload", "until_tokens": 100}
                resp = await http.post(f"/v1/sessions/{hot_session()}/memory", json=body)
                tally.count("offload", resp.status_code)

        async def sweeper() -> int:
            engine = create_async_engine(to_sqlalchemy_url(database_url))
            sweeps = 0
            try:
                while not done.is_set():
                    async with unit_of_work(create_sessionmaker(engine)) as db:
                        await enqueue(db, TaskName.SWEEP, {"timestamp": int(time.time())})
                    sweeps += 1
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), SWEEP_EVERY_SECONDS)
            finally:
                await engine.dispose()
            return sweeps

        queue = list(targets)

        async def eraser() -> None:
            while queue:
                target = queue.pop(0)
                progress[0] += 1
                path = (
                    f"/v1/users/{target.name}"
                    if target.kind == "user"
                    else (f"/v1/sessions/{target.name}")
                )
                sent_at = time.time()
                resp = await http.delete(path)
                tally.answered.setdefault(target.kind, []).append(time.time() - sent_at)
                tally.load.append(os.getloadavg()[0])
                tally.count(f"{target.kind} erase", resp.status_code)
                if resp.status_code != 202:
                    print(f"{target.kind} erase {resp.status_code}: {resp.text}", flush=True)
                    continue
                body = resp.json()
                ids = (
                    [s["erase_receipt_id"] for s in body["sessions"]]
                    + [m["erase_receipt_id"] for m in body["memories"]]
                    if target.kind == "user"
                    else [body["erase_receipt_id"]]
                )
                tally.receipts.extend((target.kind, r, sent_at) for r in ids)

        load = [asyncio.create_task(appender(n)) for n in range(args.appenders)]
        load += [asyncio.create_task(offloader()) for _ in range(args.offloaders)]
        sweeps_task = asyncio.create_task(sweeper())
        erase_started = time.monotonic()
        await asyncio.gather(*(eraser() for _ in range(args.erasers)))
        erase_seconds = time.monotonic() - erase_started
        done.set()
        await asyncio.gather(*load)
        sweeps = await sweeps_task

        pending = list(tally.receipts)
        deadline = time.monotonic() + 600
        while pending and time.monotonic() < deadline:
            still = []
            for kind, receipt_id, sent_at in pending:
                body = (await http.get(f"/v1/erase-receipts/{receipt_id}")).json()
                if body.get("status") == "completed":
                    completed = datetime.fromisoformat(body["completed_at"]).timestamp()
                    tally.completion.setdefault(kind, []).append(completed - sent_at)
                else:
                    still.append((kind, receipt_id, sent_at))
            pending = still
            if pending:
                await asyncio.sleep(0.5)

        lost = 0
        for sid, acked in tally.acknowledged.items():
            stored: dict[int, str] = {}
            params: dict[str, Any] = {"limit": 500}  # the API's largest page by default
            while True:
                page = (await http.get(f"/v1/sessions/{sid}/turns", params=params)).json()
                stored.update({t["seq"]: t["content"] for t in page["turns"]})
                if not page["next_cursor"]:
                    break
                params["cursor"] = page["next_cursor"]
            lost += sum(1 for seq, content in acked.items() if stored.get(seq) != content)

    text = log.read_text(errors="replace")
    if args.keep_log:
        Path(args.keep_log).write_text(text)
    pg_text = pg_log.read_text(errors="replace")
    print(
        f"\nerases sent over {erase_seconds:.0f} s, {args.erasers} at a time; "
        f"load: {args.appenders} appenders, {args.offloaders} offloaders"
    )
    for what, statuses in sorted(tally.statuses.items()):
        by_class = Counter(f"{s // 100}xx" for s in statuses.elements())
        detail = ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items()))
        print(f"{what:14} {sum(statuses.values()):6}  5xx {by_class['5xx']:4}  ({detail})")
    for kind, values in sorted(tally.answered.items()):
        print(
            f"{kind} erase requests answered {len(values)}: p50 {statistics.median(values):.2f} s, "
            f"p95 {percentile(values, 0.95):.2f} s, max {max(values):.2f} s"
        )
    print(
        f"load average (1 min) while erasing: {min(tally.load):.1f}-{max(tally.load):.1f}, "
        f"median {statistics.median(tally.load):.1f} ({os.cpu_count()} CPUs)"
    )
    for kind, values in sorted(tally.completion.items()):
        print(
            f"{kind} erase receipts completed {len(values)}: from request p50 "
            f"{statistics.median(values):.2f} s, p95 {percentile(values, 0.95):.2f} s, "
            f"max {max(values):.2f} s"
        )
    print(f"receipts not completed after 600 s: {len(pending)}")
    acked_total = sum(len(a) for a in tally.acknowledged.values())
    print(f"bystander turns acknowledged {acked_total}, missing or changed {lost}")
    print(
        f"sweeps enqueued {sweeps}, counter repairs logged (all false) "
        f"{text.count('counters drifted')}"
    )
    errors = [line[:200] for line in text.splitlines() if "error" in line.lower()]
    print(f"lines saying error in contextd's log {len(errors)}")
    for line in list(dict.fromkeys(errors))[:10]:
        print(f"  {line}")
    print(
        f"deadlocks in the PostgreSQL log {pg_text.count('deadlock detected')}, "
        f"transaction retries logged {text.count('; attempt ')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--sessions-per-user", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--erasers", type=int, default=4)
    parser.add_argument("--appenders", type=int, default=6)
    parser.add_argument("--offloaders", type=int, default=2)
    parser.add_argument("--bystanders", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--port", type=int, default=18470)
    parser.add_argument("--serve-args", default="")
    parser.add_argument("--keep-log", help="copy contextd's log here")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="erase-bench-") as tmp,
        contextd_dev(Path(tmp), args.port, ["--auth", *args.serve_args.split()]) as server,
    ):
        pg_log = Path(tmp) / "stack" / "pg" / "log"
        asyncio.run(run(server.url, server.database_url, Path(tmp) / "contextd.log", pg_log, args))


if __name__ == "__main__":
    main()
