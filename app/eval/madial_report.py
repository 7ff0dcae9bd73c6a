"""Markdown report of a MADial-Bench run (`contextd eval madial`)."""

import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.eval.madial import SPLITS, lexical_only, split_of, summarise_by_split
from app.eval.madial_driver import MadialReply, MadialRun, latency_line

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


def reply_summary(replies: Sequence[MadialReply]) -> dict[str, dict[str, float]]:
    """Per split (all, tune, check): n, each judge's accuracy, tokens, failed calls."""
    out: dict[str, dict[str, float]] = {}
    for split in ("all", *SPLITS):
        rows = [r for r in replies if split == "all" or split_of(r.index) == split]
        if rows:
            out[split] = {
                "n": float(len(rows)),
                "published": statistics.fmean(r.published for r in rows),
                "strict": statistics.fmean(r.strict for r in rows),
                "prompt_tokens": statistics.fmean(r.prompt_tokens for r in rows),
                "memory_tokens": statistics.fmean(r.memory_tokens for r in rows),
                "errors": float(sum(r.error is not None for r in rows)),
            }
    return out


def reply_table(replies: Sequence[MadialReply]) -> str:
    lines = [
        "| split | n | J (published judge) | strict | prompt tokens | notes + user memory tokens "
        "| failed calls |",
        "|---|---|---|---|---|---|---|",
    ]
    for split, row in reply_summary(replies).items():
        lines.append(
            f"| {split} | {int(row['n'])} | {row['published']:.3f} | {row['strict']:.3f} | "
            f"{row['prompt_tokens']:.0f} | {row['memory_tokens']:.0f} | {int(row['errors'])} |"
        )
    return "\n".join(lines)


def _reply_section(run: MadialRun) -> str:
    if not run.replies:
        return ""
    return f"""
## Replies judged (`--answer-llm`, recall budget {run.config.answer_budget})

Each dialogue up to its user's last line in a fresh session of that user; a build-prompt with
that line as the query; the reply model (instructions `app/eval/prompts/madial_reply_system.txt`
first) writes the assistant's next turn; the published LoCoMo judge (J) and the strict judge
grade it against the dataset's reply at the test turn (the one that brings up the memory).

{reply_table(run.replies)}
"""


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
        "reply_summary": reply_summary(run.replies),
        "replies": [asdict(r) for r in run.replies],
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
{_reply_section(run)}
Latency: {latency_line(run.recall_ms)}; storing the memories took {run.remember_s:.1f}s.
Recalls without the query's embedding (lexical only: `vector_unavailable`):
{lexical_only(run.contextd)} of {len(run.contextd)}.

{REFERENCE}
"""
    path = out / f"madial_{cfg.lang}_report.md"
    path.write_text(text)
    return path
