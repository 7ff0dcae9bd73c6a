"""Micro-benchmark: BM25 scoring of one query over 5,000 synthetic ~100-term documents.

Run: python benchmarks/bm25_speed.py [--docs 5000] [--runs 200]
Prints build time and median / p95 latency of `BM25Index.score(query, top_n=30)`.
Documents draw from a Zipf-like 20,000-word vocabulary, so common query terms have long postings.
"""

import argparse
import random
import statistics
import time
from collections import Counter

from app.recall.bm25 import BM25Index


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=5_000)
    parser.add_argument("--terms", type=int, default=100, help="terms per document")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    vocab = [f"w{i}" for i in range(20_000)]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    docs = [(f"d{i}", rng.choices(vocab, weights, k=args.terms)) for i in range(args.docs)]

    start = time.perf_counter()
    index = BM25Index(docs)
    build_lists = time.perf_counter() - start
    counts = [(doc_id, Counter(doc_terms)) for doc_id, doc_terms in docs]
    start = time.perf_counter()
    BM25Index.from_term_counts(counts)
    build_counts = time.perf_counter() - start

    queries = [
        [*rng.sample(vocab[:100], 3), *rng.sample(vocab[100:5_000], 7)] for _ in range(args.runs)
    ]
    index.score(queries[0], top_n=30)  # warm-up
    timings: list[float] = []
    for query in queries:
        start = time.perf_counter()
        index.score(query, top_n=30)
        timings.append((time.perf_counter() - start) * 1000)

    print(f"docs={args.docs} terms/doc={args.terms} query terms=10 runs={args.runs}")
    print(f"build from term lists: {build_lists * 1000:.1f} ms")
    print(f"build from term counts: {build_counts * 1000:.1f} ms")
    print(
        f"score top-30: median {statistics.median(timings):.3f} ms, "
        f"p95 {_percentile(timings, 0.95):.3f} ms, max {max(timings):.3f} ms"
    )


if __name__ == "__main__":
    main()
