"""Append latency against a running server: single-turn appends, sequential, several runs.

    .venv/bin/contextd dev --port 18100 &          # in another terminal / directory
    .venv/bin/python -m benchmarks.append_latency --url http://127.0.0.1:18100 [--api-key K]

Prints p50/p95 per run and the median of the runs' p50/p95 (milliseconds, client side, loopback).
"""

import argparse
import statistics
import time
import uuid

import httpx


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--appends", type=int, default=200)
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    p50s, p95s = [], []
    with httpx.Client(base_url=args.url, headers=headers, timeout=30) as http:
        for run in range(args.runs):
            sid = f"bench-append-{uuid.uuid4().hex[:8]}"
            latencies = []
            for i in range(args.appends):
                role = "user" if i % 2 == 0 else "assistant"
                content = f"turn {i}: please keep the receipt R-{i:05d} — 请保留收据。"
                started = time.perf_counter()
                resp = http.post(
                    f"/v1/sessions/{sid}/turns",
                    json={"turns": [{"role": role, "content": content}]},
                )
                latencies.append((time.perf_counter() - started) * 1000)
                resp.raise_for_status()
            p50s.append(percentile(latencies, 0.50))
            p95s.append(percentile(latencies, 0.95))
            print(f"run {run + 1}: {args.appends} appends", end="  ")
            print(f"p50 {p50s[-1]:.2f} ms  p95 {p95s[-1]:.2f} ms")
    p50, p95 = statistics.median(p50s), statistics.median(p95s)
    print(f"median over runs: p50 {p50:.2f} ms  p95 {p95:.2f} ms")


if __name__ == "__main__":
    main()
