"""build-prompt on tool-calling sessions, two servers side by side: the same tau-bench runs
replayed into both, a build before every assistant step that calls tools (as
`contextd eval agent` does), A and B alternating which goes first, so both see the same load.
Prints client-wall and server `total` p50/p95 per server and the ratio B/A.

A is contextd without tool-result clearing (e.g. a checkout of the commit before it, run as
`contextd dev` from its own directory), B this checkout:

    .venv/bin/python -m benchmarks.agent_build_ab --a http://127.0.0.1:18501 \\
        --b http://127.0.0.1:18502 --data ../shared/eval/agent/tau_bench_airline_dev.json \\
        --tasks 12-24 --trials 0-3 --limit 3500
"""

import argparse
import asyncio
import time
import uuid

import httpx

from app.eval.agent import AgentRun, load_runs, parse_ranges
from app.eval.agent_driver import wire_turn
from benchmarks.build_prompt_latency import percentile


async def build(http: httpx.AsyncClient, sid: str, system: str) -> tuple[float, float]:
    """(client wall ms, server total ms) of one build without a query."""
    started = time.perf_counter()
    resp = await http.post(
        f"/v1/sessions/{sid}/build-prompt", json={"system": system, "format": "openai"}
    )
    wall = (time.perf_counter() - started) * 1000
    resp.raise_for_status()
    return wall, float(resp.json()["timings_ms"]["total"])


async def replay(
    clients: dict[str, httpx.AsyncClient],
    run: AgentRun,
    limit: int,
    times: dict[str, list[tuple[float, float]]],
) -> None:
    sid = f"ab-{run.key}-{uuid.uuid4().hex[:6]}"
    for http in clients.values():
        config = {"context_limit": limit, "reserve_tokens": 500}
        (await http.put(f"/v1/sessions/{sid}", json=config)).raise_for_status()
    steps = {step.index for step in run.steps}
    for index, message in enumerate(run.messages):
        if index in steps:
            order = list(clients) if index % 2 else list(reversed(clients))
            for side in order:
                times[side].append(await build(clients[side], sid, run.system))
        for http in clients.values():
            resp = await http.post(
                f"/v1/sessions/{sid}/turns", json={"turns": [wire_turn(message)]}
            )
            resp.raise_for_status()


async def main(args: argparse.Namespace) -> None:
    runs = load_runs(args.data, parse_ranges(args.tasks), parse_ranges(args.trials))
    times: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    async with (
        httpx.AsyncClient(base_url=args.a, timeout=120) as a,
        httpx.AsyncClient(base_url=args.b, timeout=120) as b,
    ):
        for run in runs:
            await replay({"A": a, "B": b}, run, args.limit, times)
    print(f"{len(runs)} runs, {len(times['A'])} builds a side, limit {args.limit}, 2 cores")
    for what, at in (("client wall", 0), ("server total", 1)):
        line = []
        for side in ("A", "B"):
            values = [t[at] for t in times[side]]
            p50, p95 = percentile(values, 0.5), percentile(values, 0.95)
            line.append(f"{side} p50 {p50:.1f} p95 {p95:.1f}")
        ratio = percentile([t[at] for t in times["B"]], 0.5) / percentile(
            [t[at] for t in times["A"]], 0.5
        )
        print(f"{what} ms: {'; '.join(line)}; B/A p50 {ratio:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="contextd without clearing")
    parser.add_argument("--b", required=True, help="contextd with clearing")
    parser.add_argument("--data", required=True)
    parser.add_argument("--tasks", default="12-24")
    parser.add_argument("--trials", default="0-3")
    parser.add_argument("--limit", type=int, default=3500)
    asyncio.run(main(parser.parse_args()))
