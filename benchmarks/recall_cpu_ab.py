"""CPU per recall build, two code trees side by side on the same data: the server's and its
PostgreSQL's CPU time per build from /proc, and whether both build the same prompts.

A `contextd dev` runs on a data directory holding the floor's 5,000-turn session (`prepare`
starts one and loads it as `floor_compare` does, then leaves it running). `compare` starts one
API process (`contextd serve`) from each tree against that stack and sends both the floor's
queries, alternating blocks of `--block` builds (A, B, B, A, ...) so both see the same machine
load. Every query is embedded once before the measured blocks (the embedding cache then answers
both sides): the figures are the build's own CPU, without the e5 query embedding both sides pay
alike; with `--embed` the cache is emptied before each block, so every build embeds its query
(the wall time of a build as the floor measures it). The first pass also compares the two
trees' responses field by field (all but
`build_id` and `timings_ms`).

    .venv/bin/python -m benchmarks.recall_cpu_ab prepare --data-dir /tmp/rc/data --port 18900
    .venv/bin/python -m benchmarks.recall_cpu_ab compare --data-dir /tmp/rc/data \\
        --a /tmp/rc/main --b . --builds 120 --block 40 --rounds 3
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from app.runtime.cli import running_dev
from benchmarks.build_prompt_latency import ingest, percentile, wait_offloaded
from benchmarks.floor_compare import (
    BIG_CONFIG,
    BIG_SESSION,
    Stack,
    floor_module,
    forget_query_embeddings,
    wait_healthy,
)


def prepare(data_dir: Path, port: int, turns: int) -> None:
    """Start `contextd dev` on `data_dir` (left running) and load the recall session."""
    env = dict(os.environ, CONTEXTD_DATA_DIR=str(data_dir))
    data_dir.mkdir(parents=True, exist_ok=True)
    log = (data_dir.parent / "dev.log").open("a")
    command = [sys.executable, "-m", "app.runtime.cli", "dev", "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, server, f"server at {base} did not start")

    async def load() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=120) as http:
            await ingest(http, BIG_SESSION, turns, BIG_CONFIG)
            info = await wait_offloaded(http, BIG_SESSION, True, 7200)
            print(
                f"{BIG_SESSION}: {info['counts']['chunks']} chunks embedded; dev pid {server.pid}"
            )

    asyncio.run(load())


def cli_module(tree: Path) -> str:
    """The `contextd` command's module in `tree`: trees from before the composition roots moved
    to app/runtime keep it at app/cli.py."""
    return "app.runtime.cli" if (tree / "app" / "runtime" / "cli.py").exists() else "app.cli"


@contextmanager
def serve(tree: Path, data_dir: Path, port: int) -> Iterator[tuple[str, int]]:
    """`contextd serve` (API only) run from `tree`'s sources against the running dev stack."""
    env = dict(
        os.environ,
        CONTEXTD_DATA_DIR=str(data_dir.resolve()),
        CONTEXTD_PORT=str(port),
        CONTEXTD_AUTH_DISABLED="true",
        PYTHONPATH=str(tree.resolve()),
    )
    log = (data_dir.parent / f"serve-{port}.log").open("w")
    command = [sys.executable, "-m", cli_module(tree), "serve"]
    server = subprocess.Popen(command, env=env, cwd=tree, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, server, f"server at {base} did not start")
        yield base, server.pid
    finally:
        server.terminate()
        server.wait(30)
        log.close()


# The build's stages up to the query's embedding, in the order they run (`timings_ms`): what runs
# after them is the build's part after the embedding, at 1 client its critical path.
_BEFORE_VECTOR = (
    "prepare",
    "notes_and_offload",
    "user_memory",
    "recall_rewrite",
    "recall_rewrite_llm",
    "recall_exact",
    "recall_lexical",
    "recall_memories",
    "recall_embed",
)


def after_embedding(timings: dict[str, float]) -> tuple[float, float]:
    """(`total` less the embedding's wait, `total` less every stage up to the embedding's end):
    the build's time besides the embedding, and its time after the query vector came."""
    total = timings["total"]
    return (
        total - timings.get("recall_embed", 0.0),
        total - sum(timings.get(stage, 0.0) for stage in _BEFORE_VECTOR),
    )


def _comparable(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("build_id", "timings_ms")}


def scores_apart(a: Any, b: Any) -> float | None:
    """The largest difference between two responses' scores when they differ in nothing else
    (a cosine summed in another order by another engine differs in its last digits), else
    None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return None
        apart = 0.0
        for key, value in a.items():
            other = b[key]
            if key == "score" and isinstance(value, float) and isinstance(other, float):
                apart = max(apart, abs(value - other))
                continue
            found = scores_apart(value, other)
            if found is None:
                return None
            apart = max(apart, found)
        return apart
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return None
        gaps = [scores_apart(x, y) for x, y in zip(a, b, strict=True)]
        known = [gap for gap in gaps if gap is not None]
        return max(known, default=0.0) if len(known) == len(gaps) else None
    return 0.0 if a == b else None


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two responses first differ (a JSON path and both values), None when they do not."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            found = first_difference(a.get(key), b.get(key), f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return None if a == b else f"{path}: {str(a)[:80]!r} / {str(b)[:80]!r}"


async def _builds(
    http: httpx.AsyncClient, sid: str, queries: list[str], walls: list[float] | None = None
) -> list[dict[str, Any]]:
    out = []
    for query in queries:
        started = time.perf_counter()
        resp = await http.post(f"/v1/sessions/{sid}/build-prompt", json={"query": query})
        resp.raise_for_status()
        if walls is not None:
            walls.append((time.perf_counter() - started) * 1000)
        out.append(resp.json())
    return out


async def _concurrent_builds(
    http: httpx.AsyncClient, sid: str, queries: list[str], clients: int, walls: list[float]
) -> list[dict[str, Any]]:
    """`queries` sent by `clients` concurrent clients (client k sends queries k, k+clients, ...)."""
    parts = await asyncio.gather(
        *(_builds(http, sid, queries[k::clients], walls) for k in range(clients))
    )
    return [body for part in parts for body in part]


async def compare(args: argparse.Namespace) -> None:
    dev = running_dev(args.data_dir)
    if dev is None:
        raise SystemExit(f"no contextd dev running on {args.data_dir}: run `prepare` first")
    if args.locomo:
        samples = json.loads(args.locomo.read_text())
        sample = next(s for s in samples if args.session.startswith(f"locomo-{s['sample_id']}-"))
        queries = [str(q["question"]) for q in sample["qa"]][: args.builds]
    else:
        queries = floor_module(args.floor_dir).queries(args.builds, 7)
    async with AsyncExitStack() as http:
        with ExitStack() as stack:
            sides = {
                "A": stack.enter_context(serve(args.a, args.data_dir, args.port)),
                "B": stack.enter_context(serve(args.b, args.data_dir, args.port + 1)),
            }
            clients = {
                name: await http.enter_async_context(httpx.AsyncClient(base_url=b, timeout=120))
                for name, (b, _) in sides.items()
            }
            # The first pass embeds every query (then cached for both) and holds the index caches.
            first = {name: await _builds(clients[name], args.session, queries) for name in sides}
            differ = [
                i
                for i, (a, b) in enumerate(zip(first["A"], first["B"], strict=True))
                if _comparable(a) != _comparable(b)
            ]
            print(f"{len(queries)} builds compared: {len(differ)} differ {differ[:10]}")
            apart = [scores_apart(*(_comparable(first[n][i]) for n in ("A", "B"))) for i in differ]
            beyond = [i for i, gap in zip(differ, apart, strict=True) if gap is None]
            gaps = [gap for gap in apart if gap is not None]
            print(f"  {len(beyond)} differ in more than their scores {beyond[:10]}; the others' "
                  f"scores at most {max(gaps, default=0.0):.6f} apart")  # fmt: skip
            for i in beyond[:3]:
                a_body, b_body = (_comparable(first[n][i]) for n in ("A", "B"))
                print(f"  build {i}: {first_difference(a_body, b_body)}")
            cpu: dict[str, dict[str, list[float]]] = {
                n: {"server": [], "postgres": []} for n in sides
            }
            totals: dict[str, list[float]] = {n: [] for n in sides}
            besides: dict[str, list[float]] = {n: [] for n in sides}  # total less the embedding
            after_vector: dict[str, list[float]] = {n: [] for n in sides}  # since the vector came
            walls: dict[str, list[float]] = {n: [] for n in sides}
            spent: dict[str, float] = dict.fromkeys(sides, 0.0)  # seconds sending measured blocks
            lexical_only: dict[str, int] = dict.fromkeys(sides, 0)  # builds without a query vector
            # The measured builds' responses, compared too: they run on warm per-process caches.
            measured: dict[str, list[dict[str, Any]]] = {n: [] for n in sides}
            stacks = {n: Stack(pid, dev.database_url, dev.redis_url, os.getpid()) for n, (_, pid) in
                  sides.items()}  # fmt: skip
            for r in range(args.rounds):
                for start in range(0, len(queries), args.block):
                    block = queries[start : start + args.block]
                    order = ("A", "B") if (r + start // args.block) % 2 == 0 else ("B", "A")
                    for name in order:
                        if args.embed:
                            forget_query_embeddings(dev.redis_url)
                        parts = stacks[name].parts()
                        before = stacks[name].cpu(parts)
                        sent = time.perf_counter()
                        bodies = await _concurrent_builds(
                            clients[name], args.session, block, args.clients, walls[name]
                        )
                        spent[name] += time.perf_counter() - sent
                        after = stacks[name].cpu(parts)
                        for part in ("server", "postgres"):
                            cpu[name][part].append((after[part] - before[part]) * 1000 / len(block))
                        totals[name].extend(float(b["timings_ms"]["total"]) for b in bodies)
                        for b in bodies:
                            rest, later = after_embedding(b["timings_ms"])
                            besides[name].append(rest)
                            after_vector[name].append(later)
                        lexical_only[name] += sum(
                            "vector_unavailable" in b["fallbacks"] for b in bodies
                        )
                        measured[name].extend(
                            sorted(bodies, key=lambda b: str(b["recall"]["query_raw"]))
                        )
            load = os.getloadavg()
    warm_differ = sum(
        _comparable(a) != _comparable(b) for a, b in zip(measured["A"], measured["B"], strict=True)
    )
    print(f"{len(measured['A'])} measured builds compared: {warm_differ} differ")
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {args.rounds} rounds x "
          f"{len(queries)} builds per side, blocks of {args.block}, "
          f"{args.clients} client(s)")  # fmt: skip
    print("| side | server CPU ms/build median (blocks) | PostgreSQL CPU ms/build median | "
          "timings total p50 / p95 ms | total less embedding p50 | after the vector p50 | "
          "client wall p50 / p95 ms | builds/s | lexical only |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for name in sides:
        s, p = cpu[name]["server"], cpu[name]["postgres"]
        print(
            f"| {name} {args.a if name == 'A' else args.b} | {statistics.median(s):.2f} "
            f"({min(s):.2f}-{max(s):.2f}) | {statistics.median(p):.2f} ({min(p):.2f}-{max(p):.2f})"
            f" | {percentile(totals[name], 0.5):.2f} / {percentile(totals[name], 0.95):.2f} | "
            f"{percentile(besides[name], 0.5):.2f} | {percentile(after_vector[name], 0.5):.2f} | "
            f"{percentile(walls[name], 0.5):.2f} / {percentile(walls[name], 0.95):.2f} | "
            f"{len(walls[name]) / spent[name]:.1f} | {lexical_only[name]} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--port", type=int, default=18900)
    p.add_argument("--turns", type=int, default=5000)
    c = sub.add_parser("compare")
    c.add_argument("--data-dir", type=Path, required=True)
    c.add_argument("--a", type=Path, required=True, help="code tree A (e.g. main, unpacked)")
    c.add_argument("--b", type=Path, required=True, help="code tree B")
    c.add_argument("--port", type=int, default=18910)
    c.add_argument("--floor-dir", type=Path, default=Path("../shared/perf"))
    c.add_argument("--session", default=BIG_SESSION, help="the session built for")
    c.add_argument(
        "--locomo",
        type=Path,
        help="ask a LoCoMo file's questions of the sample the session holds "
        "(`locomo-<sample_id>-...`, as `contextd eval locomo` names it) instead of the floor's",
    )
    c.add_argument("--builds", type=int, default=120)
    c.add_argument(
        "--clients", type=int, default=1, help="concurrent clients sending a measured block"
    )
    c.add_argument("--block", type=int, default=40)
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument(
        "--embed",
        action="store_true",
        help="empty the query-embedding cache before each block: every build embeds its query",
    )
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.data_dir, args.port, args.turns)
    else:
        asyncio.run(compare(args))


if __name__ == "__main__":
    main()
