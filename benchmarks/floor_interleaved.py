"""Recall builds of code trees and the floor's recall, one query at a time, all at one moment.

`floor_compare` measures the floor and contextd one phase after the other: on this shared
machine the host's speed and the other developers' load move between the phases, and the floor
moves more than contextd (its query embedding spins two OpenMP threads, which a busy second core
stalls), so a ratio there mixes the code with the minute it ran in. Here every query goes to each
side in a shuffled order before the next query is sent (1 client): the sides share each moment's
load, and the per-query ratios cancel it.

The contextd sides are `contextd serve` processes started from each `--tree` (the code as it is
in that directory, e.g. a worktree at an older commit) on a `contextd dev` stack that holds the
floor's 5,000-turn recall session (`benchmarks.recall_cpu_ab prepare`); the floor is
`floor_bench.py` from `--floor-dir` with as many chunks as that session has, run as it is up to
its measurements, which are left out: its server stays up for the queries here (`hold_floor`).
Each side gets the floor's query with its own letter appended, so every build embeds its query
(the sides share one query-embedding cache) and the token counts match.

Prints per side the client wall p50 / p95, the median of the per-query ratios to the floor and
to the first tree, and for the trees the p50 of each `timings_ms` stage, of the time outside the
server's `total` (HTTP, the response's serialisation, the client) and of the wall less the
query embedding's wait (`recall_embed`); and the load average before and after.

    .venv/bin/python -m benchmarks.recall_cpu_ab prepare --data-dir /tmp/fi/data --port 18960
    .venv/bin/python -m benchmarks.floor_interleaved --data-dir /tmp/fi/data \\
        --tree /tmp/wt-old --tree . --queries 400
"""

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from app.runtime.cli import running_dev
from benchmarks.build_prompt_latency import percentile
from benchmarks.floor_compare import BIG_SESSION, floor_module, stop_process_group
from benchmarks.recall_cpu_ab import serve

FLOOR_PORT = 18931  # floor_bench.py's own
FLOOR_READY = "floor ready"
WARM_UP = 10


def hold_floor() -> None:
    """`floor_bench.py`'s `main` as it is (its data, indexes, server) up to its first
    measurement, which instead prints `FLOOR_READY` and waits for stdin to close; the floor then
    stops its server and stack as on any error (argv: the floor directory, then its arguments)."""
    floor_dir = Path(sys.argv[1])
    bench = floor_module(floor_dir)

    async def held(*_: Any) -> tuple[float, float, float]:
        print(FLOOR_READY, flush=True)
        sys.stdin.read()
        raise SystemExit(0)

    bench.load = held
    sys.argv = [str(floor_dir / "floor_bench.py"), *sys.argv[2:]]
    bench.main()


@contextmanager
def floor_server(floor_dir: Path, chunks: int) -> Iterator[str]:
    """The floor's server, up while the context lasts; its base URL."""
    root = Path(__file__).resolve().parent.parent
    command = [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {str(root)!r}); "
        "from benchmarks.floor_interleaved import hold_floor; hold_floor()",
        str(floor_dir.resolve()),
        "--chunks",
        str(chunks),
    ]
    floor = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        start_new_session=True,
    )
    assert floor.stdin is not None and floor.stdout is not None
    try:
        for line in floor.stdout:
            if line.strip() == FLOOR_READY:
                break
        else:
            raise SystemExit("the floor stopped before it was ready")
        yield f"http://127.0.0.1:{FLOOR_PORT}"
    finally:
        floor.stdin.close()
        stop_process_group(floor)


Send = Callable[[httpx.AsyncClient, str], Any]


async def measure(
    sides: dict[str, Send], queries: list[str]
) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]]]:
    """Each query to every side in a shuffled order; per side the client walls (ms) and the
    stages of its answers' `timings_ms` (with the derived `~` ones)."""
    walls: dict[str, list[float]] = {name: [] for name in sides}
    stages: dict[str, dict[str, list[float]]] = {name: {} for name in sides}
    async with httpx.AsyncClient(timeout=120) as http:
        for name, send in sides.items():
            for k in range(WARM_UP):
                await send(http, f"warm-up {k} {name}")
        for i, query in enumerate(queries):
            order = list(sides)
            random.Random(i).shuffle(order)
            for name in order:
                started = time.perf_counter()
                timings = await sides[name](http, f"{query} {name}")
                wall = (time.perf_counter() - started) * 1000
                walls[name].append(wall)
                if timings is None:
                    continue
                timings["~outside_total"] = wall - timings["total"]
                timings["~wall_less_embed"] = wall - timings.get("recall_embed", 0.0)
                for stage, value in timings.items():
                    stages[name].setdefault(stage, []).append(value)
    return walls, stages


def contextd_side(base: str) -> Send:
    async def send(http: httpx.AsyncClient, query: str) -> dict[str, float]:
        response = await http.post(
            f"{base}/v1/sessions/{BIG_SESSION}/build-prompt", json={"query": query}
        )
        response.raise_for_status()
        return dict(response.json()["timings_ms"])

    return send


def floor_side(base: str) -> Send:
    async def send(http: httpx.AsyncClient, query: str) -> None:
        response = await http.get(f"{base}/floor_recall/s0", params={"q": query})
        response.raise_for_status()

    return send


def report(
    trees: list[str], walls: dict[str, list[float]], stages: dict[str, dict[str, list[float]]]
) -> None:
    names = list(walls)
    first, floor = names[0], names[-1]
    print("| side | client wall p50 / p95 ms | per-query ratio to the floor | to side A |")
    print("|---|---|---|---|")
    for name, label in zip(names, [*trees, "floor"], strict=True):
        to_floor = statistics.median(a / b for a, b in zip(walls[name], walls[floor], strict=True))
        to_first = statistics.median(a / b for a, b in zip(walls[name], walls[first], strict=True))
        print(
            f"| {name} {label} | {percentile(walls[name], 0.5):.2f} / "
            f"{percentile(walls[name], 0.95):.2f} | {to_floor:.3f} | {to_first:.3f} |"
        )
    measured = [name for name in names if stages[name]]
    keys = sorted(
        {stage for name in measured for stage in stages[name]},
        key=lambda stage: -statistics.median(stages[first].get(stage, [0.0])),
    )
    print("\n| stage p50 ms | " + " | ".join(measured) + " |")
    print("|---|" + "---|" * len(measured))
    for stage in keys:
        values = [stages[name].get(stage) for name in measured]
        cells = [f"{statistics.median(v):.2f}" if v else "-" for v in values]
        print(f"| {stage} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="a prepared dev stack")
    parser.add_argument("--tree", type=Path, action="append", required=True, help="code tree")
    parser.add_argument("--floor-dir", type=Path, default=Path("../shared/perf"))
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--seed", type=int, default=41, help="of the floor's query generator")
    parser.add_argument("--port", type=int, default=18970, help="the first tree's; then +1")
    args = parser.parse_args()
    dev = running_dev(args.data_dir)
    if dev is None:
        raise SystemExit(f"no contextd dev running on {args.data_dir}: see the docstring")
    session = httpx.get(f"{dev.api_url}/v1/sessions/{BIG_SESSION}", timeout=30).json()
    chunks = int(session["counts"]["chunks"])
    queries = floor_module(args.floor_dir).queries(args.queries, args.seed)
    with ExitStack() as stack:
        sides: dict[str, Send] = {}
        for k, tree in enumerate(args.tree):
            base, _ = stack.enter_context(serve(tree, args.data_dir, args.port + k))
            sides[chr(ord("A") + k)] = contextd_side(base)
        floor = stack.enter_context(floor_server(args.floor_dir, chunks))
        sides[chr(ord("A") + len(args.tree))] = floor_side(floor)
        before = os.getloadavg()
        walls, stages = asyncio.run(measure(sides, queries))
        after = os.getloadavg()
    print(
        f"{len(queries)} queries a side, 1 client, {chunks} chunks; load average "
        f"{before[0]:.1f} before, {after[0]:.1f} after"
    )
    report([str(tree) for tree in args.tree], walls, stages)


if __name__ == "__main__":
    main()
