"""Long turns in a small window: build-prompt latency, and how long /healthz stalls meanwhile.

    .venv/bin/contextd dev --port 18100 &          # in another terminal / directory
    .venv/bin/python -m benchmarks.long_turns --url http://127.0.0.1:18100 [--api-key K]

Each run makes a fresh session with a 2,000-token window, appends a few turns, the long turn and
a few more (so the long turn is old enough to be offloaded), then calls build-prompt, which
offloads inline (emergency). A probe requests /healthz every 20 ms throughout; its slowest answer
is the longest stall anyone else saw. Cases: 256 KB of prose, 16 KB of one letter. Prints each
run and the median and p95 over the runs (milliseconds, client side, loopback).
"""

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid

import httpx

from benchmarks.append_latency import percentile

PROSE = (
    "The deploy of ORD-4471 to Berlin failed twice; alice@example.com asked for a refund. "
    "Budget is at most 120 EUR, and the meeting moved to Tuesday.\n\n"
)
CASES = {
    "256 KB prose": (PROSE * (262_144 // len(PROSE) + 1))[:262_000],
    "16 KB one letter": "a" * 16_384,
}
SMALL = {"context_limit": 2000, "reserve_tokens": 200, "min_recent_turns": 2}


async def probe(http: httpx.AsyncClient, stop: asyncio.Event, worst: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        (await http.get("/healthz")).raise_for_status()
        worst[0] = max(worst[0], (time.perf_counter() - started) * 1000)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.02)


async def one_run(http: httpx.AsyncClient, text: str) -> tuple[float, float, list[str]]:
    sid = f"bench-long-{uuid.uuid4().hex[:8]}"
    (await http.put(f"/v1/sessions/{sid}", json=SMALL)).raise_for_status()
    turns = [{"role": "user", "content": f"small turn {i} about the trip"} for i in range(3)]
    turns.append({"role": "user", "content": text})
    turns += [{"role": "assistant", "content": f"noted {i}"} for i in range(3)]
    stop, worst = asyncio.Event(), [0.0]
    watcher = asyncio.create_task(probe(http, stop, worst))
    (await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).raise_for_status()
    started = time.perf_counter()
    built = await http.post(f"/v1/sessions/{sid}/build-prompt", json={"query": "what now?"})
    latency = (time.perf_counter() - started) * 1000
    built.raise_for_status()
    stop.set()
    await watcher
    return latency, worst[0], built.json()["fallbacks"]


async def main_async(args: argparse.Namespace) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=120) as http:
        for name, text in CASES.items():
            latencies, stalls = [], []
            for run in range(args.runs):
                latency, stall, fallbacks = await one_run(http, text)
                latencies.append(latency)
                stalls.append(stall)
                print(
                    f"{name} run {run + 1}: build-prompt {latency:.0f} ms, "
                    f"slowest /healthz {stall:.0f} ms, fallbacks {fallbacks}"
                )
            print(
                f"{name}: build-prompt median {statistics.median(latencies):.0f} ms, "
                f"p95 {percentile(latencies, 0.95):.0f} ms; slowest /healthz median "
                f"{statistics.median(stalls):.0f} ms, max {max(stalls):.0f} ms"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key")
    parser.add_argument("--runs", type=int, default=5)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
