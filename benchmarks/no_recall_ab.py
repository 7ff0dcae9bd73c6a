"""build-prompt without recall, two versions of contextd side by side on one data set.

    .venv/bin/python -m benchmarks.no_recall_ab --a-dir /tmp/main-snapshot [--b-dir .] \\
        [--rounds 10] [--requests 300] [--compare 300]

A (`--a-dir`, e.g. `git archive main | tar -x -C /tmp/main-snapshot`) and B (`--b-dir`, default
this checkout) each run as a `contextd dev` from their own directory, on one embedded PostgreSQL
and Valkey holding the floor's data shape (200 sessions x 50 turns, loaded through A; the
per-key rate limit raised so that both servers' builds stay within it). First `--compare`
builds of varied shapes (system prompt in English and Chinese, Anthropic format, a small
window, no query) are sent to both and compared byte for byte, every field but `build_id` and
`timings_ms`. Then `--rounds` rounds, alternating which side goes first, of the floor's own load
(`floor_bench.load`: its client and query generator) at 1 and 16 clients, with each server's CPU
time per request from /proc. Prints per side the medians (range) and, per round, B/A.
"""

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from app.runtime.embedded import EmbeddedStack
from benchmarks.floor_compare import (
    CLIENTS,
    SMALL_SESSIONS,
    BuildPromptClient,
    cpu_seconds,
    floor_module,
    load_contextd,
)
from benchmarks.recall_cpu_ab import cli_module

Round = tuple[float, float, float, float]  # p50 ms, p95 ms, req/s, server CPU ms per request


def path_of(j: int) -> str:
    return f"/v1/sessions/floor-s{j % SMALL_SESSIONS}/build-prompt"


def start(code: Path, port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", cli_module(code), "dev", "--port", str(port)]
    with log.open("w") as out:
        return subprocess.Popen(command, cwd=code, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_until_up(base: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{base} did not start")


def comparable(body: bytes) -> str:
    answer = json.loads(body)
    answer.pop("build_id", None)
    answer.pop("timings_ms", None)
    return json.dumps(answer, sort_keys=True, ensure_ascii=False)


async def compare(floor: Any, a: str, b: str, n: int) -> int:
    """Builds of varied shapes on both sides; returns how many answers differ."""
    rng = random.Random(7)
    differ = 0
    async with httpx.AsyncClient(timeout=60) as http:
        for j, query in enumerate(floor.queries(n, 12345)):
            shapes: list[dict[str, Any]] = [
                {"query": query},
                {"query": query, "system": "你是一个有帮助的助手。Be brief."},
                {"query": query, "format": "anthropic", "system": "sys"},
                {"query": query, "context_limit": 2000, "reserve_tokens": 500},
                {"system": [{"role": "system", "content": "x" * rng.randint(1, 50)}]},
            ]
            body = shapes[j % len(shapes)]
            got_a = await http.post(f"{a}{path_of(j)}", json=body)
            got_b = await http.post(f"{b}{path_of(j)}", json=body)
            if got_a.status_code != got_b.status_code or comparable(got_a.content) != comparable(
                got_b.content
            ):
                differ += 1
                print(f"differs: {path_of(j)} {body}", flush=True)
    return differ


async def measure(
    floor: Any, bases: dict[str, str], pids: dict[str, int], rounds: int, requests: int
) -> dict[tuple[str, int], list[Round]]:
    results: dict[tuple[str, int], list[Round]] = {}
    https = {name: httpx.AsyncClient(base_url=base, timeout=60) for name, base in bases.items()}
    try:
        clients = {name: BuildPromptClient(http) for name, http in https.items()}
        for client in clients.values():
            await floor.load(client, path_of, 4, 100)  # warm-up
        for r in range(rounds):
            order = sorted(bases, reverse=r % 2 == 1)
            for concurrency in CLIENTS:
                for name in order:
                    before = cpu_seconds(pids[name])
                    p50, p95, rps = await floor.load(clients[name], path_of, concurrency, requests)
                    cpu = (cpu_seconds(pids[name]) - before) * 1000 / requests
                    results.setdefault((name, concurrency), []).append((p50, p95, rps, cpu))
            print(f"round {r + 1} done, load average {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        for http in https.values():
            await http.aclose()
    return results


def report(results: dict[tuple[str, int], list[Round]]) -> None:
    print("| side | clients | p50 ms (range) | p95 ms | req/s | server CPU ms/request (range) |")
    print("|---|---|---|---|---|---|")
    for concurrency in CLIENTS:
        for name in ("A", "B"):
            p50, p95, rps, cpu = zip(*results[(name, concurrency)], strict=True)
            print(
                f"| {name} | {concurrency} | {statistics.median(p50):.2f} ({min(p50):.2f}-"
                f"{max(p50):.2f}) | {statistics.median(p95):.2f} | {statistics.median(rps):.0f} | "
                f"{statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f}) |"
            )
    for concurrency in CLIENTS:
        pairs = list(zip(results[("A", concurrency)], results[("B", concurrency)], strict=True))
        for label, k in (("CPU", 3), ("p50", 0), ("req/s", 2)):
            ratios = sorted(b[k] / a[k] for a, b in pairs)
            print(
                f"{concurrency} client(s), B/A per round, {label}: median "
                f"{statistics.median(ratios):.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-dir", type=Path, required=True)
    parser.add_argument("--b-dir", type=Path, default=Path.cwd())
    parser.add_argument("--floor-dir", type=Path, default=Path("../shared/perf"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=300, help="per round, side and clients")
    parser.add_argument("--compare", type=int, default=300, help="builds compared byte for byte")
    parser.add_argument(
        "--ports",
        type=lambda text: [int(port) for port in text.split(",")],
        help="A's, B's and Valkey's ports, e.g. 19610,19611,19612 (default: random)",
    )
    args = parser.parse_args()
    floor = floor_module(args.floor_dir)
    work = Path(tempfile.mkdtemp(prefix="no-recall-ab-"))
    ports = args.ports or [random.randint(18100, 18900) for _ in range(2)] + [None]
    stack = EmbeddedStack(work / "stack", persist=False).start(ports[2])
    env = dict(
        os.environ,
        DATABASE_URL=stack.database_url,
        REDIS_URL=stack.redis_url,
        CONTEXTD_LIMITS__REQUESTS_PER_MINUTE_PER_KEY=str(10**9),
    )
    servers: dict[str, subprocess.Popen[bytes]] = {}
    bases: dict[str, str] = {}
    print(f"load average at the start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    try:
        for name, code, port in (("A", args.a_dir, ports[0]), ("B", args.b_dir, ports[1])):
            own = dict(env, CONTEXTD_DATA_DIR=str(work / name))
            servers[name] = start(code.resolve(), port, own, work / f"{name}.log")
            bases[name] = f"http://127.0.0.1:{port}"
            wait_until_up(bases[name], servers[name])
        asyncio.run(load_contextd(bases["A"], 0))
        if args.compare:
            differ = asyncio.run(compare(floor, bases["A"], bases["B"], args.compare))
            print(f"{args.compare - differ} of {args.compare} builds identical", flush=True)
        if args.rounds:
            pids = {name: server.pid for name, server in servers.items()}
            report(asyncio.run(measure(floor, bases, pids, args.rounds, args.requests)))
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(30)
        stack.stop()


if __name__ == "__main__":
    main()
