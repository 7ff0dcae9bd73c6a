"""Markdown report of a MADial-Bench run (`contextd eval madial`)."""

import os
import platform
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.eval.madial import lexical_only, summarise_by_split
from app.eval.madial_driver import MadialRun, latency_line

REFERENCE = """Offline references (shared/eval/README.md, 160 dialogues, R@5 / R@10): zh BM25 over
character unigrams+bigrams .501 / .643, bm25+e5 .565 / .712, bm25+use+e5 .587 / .770, OpenAI
embeddings .694 / .824; en BM25 .483 / .602, bm25+e5 .605 / .722, bm25+use+e5 .626 / .770."""


def madial_table(run: MadialRun) -> str:
    ks = run.config.ks
    head = ["method", "split", "n", *[f"R@{k}" for k in ks], "items returned"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rows in (("contextd (memory recall)", run.contextd), ("bm25", run.bm25)):
        for split, row in summarise_by_split(rows, ks).items():
            cells = [name, split, str(int(row["n"])), *[f"{row[f'R@{k}']:.3f}" for k in ks]]
            lines.append("| " + " | ".join([*cells, f"{row['returned']:.1f}"]) + " |")
    return "\n".join(lines)


def madial_json(run: MadialRun) -> dict[str, Any]:
    ks = run.config.ks
    return {
        "summary": {
            "contextd": summarise_by_split(run.contextd, ks),
            "bm25": summarise_by_split(run.bm25, ks),
        },
        "lexical_only": lexical_only(run.contextd),
        "deduplicated": run.deduplicated,
        "dialogues": [asdict(r) for r in run.contextd],
    }


def write_madial_report(run: MadialRun, out: Path, data_path: str, label: str = "") -> Path:
    cfg = run.config
    out.mkdir(parents=True, exist_ok=True)
    dedup = ", ".join(f"{a}→{b}" for a, b in run.deduplicated) or "none"
    text = f"""# contextd — MADial-Bench ({cfg.lang}) remembered-item recall

{datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")} · data `{data_path}` · server `{cfg.url}` ·
machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()} ·
run `{cfg.run_id}`, {run.elapsed_s:.0f}s{f" · {label}" if label else ""}

Protocol: every memory's `event` text is stored with the memory tool's `remember` (scope user,
its `scene` and `emotion` as the item's tags) in a session of its user ({run.memories} memories
→ {run.stored_items} items; near-duplicates that `remember` merged: {dedup}). Each dialogue's
lines before its first test turn are appended to a fresh session of that user (`<Assistant>`
lines as assistant turns, the others as user turns), then one memory `recall` with those lines
(`Name: text`, one a line) as the query and `top_k` {max(cfg.ks)}. R@k = |top-k ∩ relevant| /
|relevant|, averaged over dialogues. BM25 runs offline over each user's memories with the same
query. Splits: **tune** = the dialogues at even positions of the file (the only ones settings
were tuned on), **check** = the odd ones.

{madial_table(run)}

Latency: {latency_line(run.recall_ms)}; storing the memories took {run.remember_s:.1f}s.
Recalls without the query's embedding (lexical only: `vector_unavailable`):
{lexical_only(run.contextd)} of {len(run.contextd)}.

{REFERENCE}
"""
    path = out / f"madial_{cfg.lang}_report.md"
    path.write_text(text)
    return path
