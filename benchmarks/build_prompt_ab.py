"""build-prompt with recall, two servers side by side: the same questions, alternating A and B
request by request, so both see the same machine load. Prints client-wall and server `total`
p50/p95 per server, the ratio B/A, and how many builds went over their limit.

Each side names a running server and a session on it that already holds offloaded history (for
example the LoCoMo sessions `contextd eval locomo` ingested); the questions come from a LoCoMo file.

    .venv/bin/python -m benchmarks.build_prompt_ab \\
        --a http://127.0.0.1:18437 locomo-conv-43-675939a7 \\
        --b http://127.0.0.1:18561 locomo-conv-43-1a2b3c4d \\
        --data ../shared/eval/locomo/locomo_dev.json --sample conv-43 --n 150
"""

import argparse
import asyncio
import json
import time
from pathlib import Path

import httpx

from benchmarks.build_prompt_latency import percentile


async def one(http: httpx.AsyncClient, sid: str, query: str) -> tuple[float, float, bool]:
    """(client wall ms, server total ms, within budget) of one default build with recall."""
    body = {"system": "You are a helpful assistant.", "query": query}
    started = time.perf_counter()
    resp = await http.post(f"/v1/sessions/{sid}/build-prompt", json=body)
    wall = (time.perf_counter() - started) * 1000
    resp.raise_for_status()
    out = resp.json()
    return wall, float(out["timings_ms"]["total"]), out["usage"]["total"] <= out["usage"]["limit"]


async def run(args: argparse.Namespace) -> None:
    samples = json.loads(Path(args.data).read_text())
    sample = next(s for s in samples if s["sample_id"] == args.sample)
    questions = [str(q["question"]) for q in sample["qa"]][: args.n]
    sides = {"A": args.a, "B": args.b}
    results: dict[str, dict[str, list[float]]] = {k: {"wall": [], "total": []} for k in sides}
    over = dict.fromkeys(sides, 0)
    clients = {k: httpx.AsyncClient(base_url=url.rstrip("/"), timeout=120) for k, (url, _) in
               sides.items()}  # fmt: skip
    try:
        for name, (_, sid) in sides.items():  # warm-up: connections, index caches, model pages
            await one(clients[name], sid, "warm up")
        for i, query in enumerate(questions):
            order = ("A", "B") if i % 2 == 0 else ("B", "A")
            for name in order:
                wall, total, ok = await one(clients[name], sides[name][1], query)
                results[name]["wall"].append(wall)
                results[name]["total"].append(total)
                over[name] += not ok
    finally:
        for client in clients.values():
            await client.aclose()
    print("| side | n | wall p50 | wall p95 | server total p50 | server total p95 | over limit |")
    print("|---|---|---|---|---|---|---|")
    for name, (url, sid) in sides.items():
        r = results[name]
        print(
            f"| {name} {url} `{sid}` | {len(r['wall'])} | {percentile(r['wall'], 0.5):.1f} | "
            f"{percentile(r['wall'], 0.95):.1f} | {percentile(r['total'], 0.5):.1f} | "
            f"{percentile(r['total'], 0.95):.1f} | {over[name]} |"
        )
    a, b = results["A"], results["B"]
    print(
        f"B/A: wall p50 {percentile(b['wall'], 0.5) / percentile(a['wall'], 0.5):.2f}, "
        f"server total p50 {percentile(b['total'], 0.5) / percentile(a['total'], 0.5):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", nargs=2, metavar=("URL", "SESSION"), required=True)
    parser.add_argument("--b", nargs=2, metavar=("URL", "SESSION"), required=True)
    parser.add_argument("--data", required=True, help="LoCoMo JSON file (questions)")
    parser.add_argument("--sample", required=True, help="sample_id whose questions are asked")
    parser.add_argument("--n", type=int, default=150, help="questions (each asked on A and B)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
