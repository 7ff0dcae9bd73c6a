"""Builds right after a 100-turn append, stage by stage: `floor_compare`'s after-append phase on
a smaller recall session, short enough to iterate on (a minute or two).

    .venv/bin/python -m benchmarks.after_append [--floor-dir ../shared/perf] [--big-turns 1500]
        [--rounds 1] [--tries 20] [--serve-args "..."]

A `contextd dev` (default settings, its own embedded stack) gets `floor_compare`'s recall session
(the same configuration and turns, `--big-turns` of them) offloaded and embedded; then each round
runs `floor_compare.after_append` (quiet recall builds, then builds each sent right after a
100-turn append) and prints every append and the build after it: their times, the watermark
level the append left and the one the build saw, and the build's stages (`timings_ms`); then the
p95 of both phases of builds and their ratio, how many appends took the window to the emergency
ratio (a count, which does not follow the machine's other load the way times do), and the median
time of those appends and of the others.
"""

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.build_prompt_latency import ingest, wait_offloaded
from benchmarks.floor_compare import (
    BIG_CONFIG,
    BIG_SESSION,
    TimedBuild,
    after_append,
    contextd_dev,
    floor_module,
    p95,
)

STAGES = ("prepare", "notes_and_offload", "recall_lexical", "recall_embed", "total")


async def load(base: str, turns: int) -> int:
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        await ingest(http, BIG_SESSION, turns, BIG_CONFIG)
        info = await wait_offloaded(http, BIG_SESSION, True, 3600)
    return int(info["counts"]["chunks"])


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def stage_line(build: TimedBuild) -> str:
    stages = " ".join(f"{s} {build.timings_ms.get(s, 0.0):6.1f}" for s in STAGES)
    return (
        f"append {build.append_ms or 0:6.1f} ms {build.appended_level or '-':9s} | build "
        f"{build.ms:6.1f} ms {build.level:9s} | {stages}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor-dir", type=Path, default=Path("../shared/perf"))
    parser.add_argument("--big-turns", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--port", type=int, default=random.randint(18100, 18900))
    parser.add_argument("--serve-args", default="", help="extra `contextd dev` arguments")
    args = parser.parse_args()
    floor = floor_module(args.floor_dir.resolve())
    with (
        tempfile.TemporaryDirectory(prefix="after-append-") as tmp,
        contextd_dev(Path(tmp), args.port, args.serve_args.split()) as server,
    ):
        started = time.monotonic()
        chunks = asyncio.run(load(server.url, args.big_turns))
        print(
            f"{args.big_turns} turns offloaded into {chunks} chunks and embedded in "
            f"{time.monotonic() - started:.0f}s"
        )
        ratios = []
        for n in range(1, args.rounds + 1):
            load_before = os.getloadavg()
            quiet, loaded = asyncio.run(after_append(floor, server.url, args.tries, n))
            print(f"round {n} (load average {load_before[0]:.1f}), builds right after an append:")
            for build in loaded:
                print("  " + stage_line(build))
            ratio = p95(loaded) / p95(quiet)
            ratios.append(ratio)
            emergency = [b.append_ms or 0 for b in loaded if b.appended_level == "emergency"]
            others = [b.append_ms or 0 for b in loaded if b.appended_level != "emergency"]
            print(
                f"  quiet p50 {statistics.median(b.ms for b in quiet):.1f} p95 {p95(quiet):.1f} ms"
                f" | after an append p50 {statistics.median(b.ms for b in loaded):.1f} "
                f"p95 {p95(loaded):.1f} ms | x{ratio:.2f} | {len(emergency)} appends took the "
                f"window to emergency, append p50 {median(emergency):.1f} ms against "
                f"{median(others):.1f} ms for the others"
            )
    end = os.getloadavg()
    print(
        f"p95 ratio per round {' '.join(f'x{r:.2f}' for r in ratios)}; load average at the end "
        f"{end[0]:.1f} {end[1]:.1f} {end[2]:.1f}; {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
