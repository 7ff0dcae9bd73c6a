"""build-prompt latency against a running server: p50/p95 per stage (`timings_ms`) and client wall.

Scenarios:
  (a) a 200-turn session that never crossed the threshold (baseline prompt, no recall work);
  (b) a session with 5,000 offloaded turns, recall in auto mode (BM25 + vector + rerank).
Each runs at 1 and 16 concurrent clients with a bounded number of requests; every query is
distinct (no query-embedding cache hits).

    .venv/bin/python -m benchmarks.build_prompt_latency --url http://127.0.0.1:8080 [--api-key K]
"""

import argparse
import asyncio
import random
import time
import uuid
from typing import Any

import httpx

WORDS = (
    "invoice budget train hotel Lyon Berlin ticket refund order meeting deadline report parcel "
    "contract window seat flight museum dinner client supplier warehouse printer license server "
    "backup migration release sprint invoice payment discount voucher passport visa"
).split()


def turn_text(rng: random.Random, i: int) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(12))
    ref, amount = rng.randint(10000, 99999), rng.randint(5, 900)
    return f"Note {i}: {words}; reference AB-{ref}, amount {amount} EUR."


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


async def ingest(http: httpx.AsyncClient, sid: str, n: int, config: dict[str, Any]) -> None:
    rng = random.Random(sid)
    (await http.put(f"/v1/sessions/{sid}", json=config)).raise_for_status()
    for start in range(0, n, 100):
        turns = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": turn_text(rng, i)}
            for i in range(start, min(n, start + 100))
        ]
        (await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).raise_for_status()


async def wait_offloaded(
    http: httpx.AsyncClient, sid: str, embedded: bool, timeout: float
) -> dict[str, Any]:
    """Wait until `sid` has offloaded (and, when `embedded`, every chunk has its vector). A
    session with no chunk whose window is under the offload trigger never offloads without more
    turns: that fails at once instead of at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        info = (await http.get(f"/v1/sessions/{sid}")).json()
        chunks, watermark = info["counts"]["chunks"], info["watermark"]
        if chunks == 0 and watermark["level"] == "normal":
            raise SystemExit(
                f"{sid}: {info['counts']['turns']} turns fill {watermark['ratio']:.0%} of the "
                "window, under the offload trigger, so nothing will be offloaded: append more "
                "turns (e.g. a larger --big-turns)"
            )
        done = chunks > 0 and watermark["level"] == "normal"
        unembedded = 0
        if done and embedded:
            cursor = None
            while True:
                params: dict[str, Any] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
                page = (await http.get(f"/v1/sessions/{sid}/chunks", params=params)).json()
                unembedded += sum(1 for c in page["chunks"] if not c["embedded"])
                cursor = page.get("next_cursor")
                if not cursor:
                    break
            done = unembedded == 0
        if done:
            return info
        if time.monotonic() > deadline:
            raise SystemExit(f"{sid} not ready after {timeout}s (unembedded chunks: {unembedded})")
        await asyncio.sleep(1.0)


async def measure(
    http: httpx.AsyncClient, sid: str, clients: int, requests: int, recall: bool
) -> dict[str, Any]:
    walls: list[float] = []
    stages: dict[str, list[float]] = {}
    fallbacks: dict[str, int] = {}
    queue = list(range(requests))

    async def client() -> None:
        while queue:
            i = queue.pop()
            query = (
                f"what was the reference for the {WORDS[i % len(WORDS)]} {uuid.uuid4().hex[:6]}?"
            )
            body: dict[str, Any] = {"system": "You are a helpful assistant.", "query": query}
            if not recall:
                body["recall"] = {"mode": "auto"}
            started = time.perf_counter()
            resp = await http.post(f"/v1/sessions/{sid}/build-prompt", json=body)
            walls.append((time.perf_counter() - started) * 1000)
            resp.raise_for_status()
            out = resp.json()
            for stage, ms in out["timings_ms"].items():
                stages.setdefault(stage, []).append(ms)
            for flag in out["fallbacks"]:
                fallbacks[flag] = fallbacks.get(flag, 0) + 1

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return {"walls": walls, "stages": stages, "fallbacks": fallbacks, "rps": requests / elapsed}


def table(rows: list[tuple[str, int, dict[str, Any]]]) -> str:
    stage_names: list[str] = []
    for _, _, r in rows:
        stage_names += [s for s in r["stages"] if s not in stage_names]
    stage_names.sort(key=lambda s: (s == "total", s.startswith("recall_"), s))
    lines = [
        "| scenario | clients | n | req/s | wall p50 | wall p95 | "
        + " | ".join(f"{s} p50/p95" for s in stage_names)
        + " | fallbacks |",
        "|" + "---|" * (7 + len(stage_names)),
    ]
    for name, clients, r in rows:
        cells = [name, str(clients), str(len(r["walls"])), f"{r['rps']:.1f}"]
        cells += [f"{percentile(r['walls'], 0.5):.1f}", f"{percentile(r['walls'], 0.95):.1f}"]
        for s in stage_names:
            v = r["stages"].get(s)
            cells.append(f"{percentile(v, 0.5):.1f}/{percentile(v, 0.95):.1f}" if v else "–")
        cells.append(", ".join(f"{k} {v}" for k, v in sorted(r["fallbacks"].items())) or "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=64)
    run_id = uuid.uuid4().hex[:8]
    async with httpx.AsyncClient(
        base_url=args.url.rstrip("/"), headers=headers, timeout=120, limits=limits
    ) as http:
        run_id = args.reuse or run_id
        small, big = f"bench-a-{run_id}", f"bench-b-{run_id}"
        if not args.reuse:
            t0 = time.monotonic()
            await ingest(http, small, args.small_turns, {})
            await ingest(
                http,
                big,
                args.big_turns,
                {"context_limit": 16000, "reserve_tokens": 2000, "min_recent_tokens": 2000},
            )
            took = time.monotonic() - t0
            print(f"ingested {args.small_turns} + {args.big_turns} turns in {took:.1f}s ({run_id})")
        t0 = time.monotonic()
        info = await wait_offloaded(http, big, not args.no_wait_embedded, args.timeout)
        print(
            f"offloaded{'' if args.no_wait_embedded else ' and embedded'} in "
            f"{time.monotonic() - t0:.1f}s: {info['counts']['chunks']} chunks"
        )
        if args.prepare_only:
            print(f"prepared: rerun with --reuse {run_id}")
            return
        small_info = (await http.get(f"/v1/sessions/{small}")).json()
        assert small_info["counts"]["chunks"] == 0, "scenario (a) must never offload"
        # One warm-up build each (connection pool, lexical index cache, first query encoding).
        for sid in (small, big):
            await http.post(f"/v1/sessions/{sid}/build-prompt", json={"query": "warm up"})
        rows = []
        for clients in args.clients:
            for name, sid, recall in (
                (f"(a) {args.small_turns} turns, never offloaded", small, False),
                (f"(b) {args.big_turns} turns offloaded, recall", big, True),
            ):
                requests = args.requests if clients == 1 else args.requests * 2
                rows.append((name, clients, await measure(http, sid, clients, requests, recall)))
        print(table(rows))
        if not (args.keep or args.reuse):
            for sid in (small, big):
                await http.delete(f"/v1/sessions/{sid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--small-turns", type=int, default=200)
    parser.add_argument("--big-turns", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=100, help="per scenario at 1 client")
    parser.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--no-wait-embedded", action="store_true")
    parser.add_argument("--prepare-only", action="store_true", help="ingest and wait, no load")
    parser.add_argument("--reuse", default=None, metavar="RUN_ID", help="use --prepare-only's")
    parser.add_argument("--keep", action="store_true", help="keep the sessions afterwards")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
