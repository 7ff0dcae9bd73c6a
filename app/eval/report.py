"""Markdown report and PNG plots of a LoCoMo run (`contextd eval locomo`)."""

import math
import os
import platform
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from app.eval.answer_report import ablation_section, answer_section
from app.eval.driver import BuildSample, LocomoRun
from app.eval.locomo import (
    CATEGORIES,
    DEGRADED_FLAGS,
    RANKING_LIMIT,
    SCORED_CATEGORIES,
    QuestionResult,
    percentile,
    summarise,
)

REFERENCE = """Reference figures (shared/eval/README.md; all 10 conversations, offline,
token = chars/4, categories 1-4 unless noted):

| unit | method | R@5 | R@10 | B500 | B1000 |
|---|---|---|---|---|---|
| single turn | bm25 | .498 | .565 | .590 | .649 |
| single turn | bm25+e5 | .505 | .581 | .625 | .719 |
| ~100-token chunks | bm25 | .649 | .717 | .632 | .711 |
| ~100-token chunks | bm25+e5 | .673 | .742 | .659 | .736 |
| ~200-token chunks | bm25+e5 | .756 | .826 | .624 | .731 |

LoCoMo paper (DRAGON over single turns, incl. category 5): R@5 56.7, R@10 66.2."""

STAGE_ORDER = ("prepare", "notes_and_offload", "assemble", "total")


def _f(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def overall_rows(run: LocomoRun) -> list[tuple[str, dict[str, float]]]:
    cfg = run.config
    rows = [
        ("contextd", summarise(run.contextd, cfg.budgets, cfg.ks).get("overall", {})),
        *(
            [("contextd memory tool", summarise(run.tool, cfg.budgets, ()).get("overall", {}))]
            if run.tool
            else []
        ),
        ("bm25 single turns", summarise(run.bm25, cfg.budgets, cfg.ks).get("overall", {})),
        (
            "bm25 single turns, framed like contextd",
            summarise(run.bm25_framed, cfg.budgets, ()).get("overall", {}),
        ),
    ]
    trunc = summarise(run.truncation, (0,), ()).get("overall", {})
    rows.append(
        (
            f"truncation (last turns in {cfg.context_limit - cfg.reserve_tokens} tokens)",
            {f"B{b}": trunc.get("B0", math.nan) for b in cfg.budgets} | {"n": trunc.get("n", 0)},
        )
    )
    return rows


def summary_table(run: LocomoRun) -> str:
    """Overall (categories 1-4) table, Markdown."""
    cfg = run.config
    head = ["method", "n", *[f"R@{k}" for k in cfg.ks], *[f"B{b}" for b in cfg.budgets]]
    head += [f"tokens@B{b}" for b in cfg.budgets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in overall_rows(run):
        cells = [name, str(int(row.get("n", 0)))]
        cells += [_f(row.get(f"R@{k}")) for k in cfg.ks]
        cells += [_f(row.get(f"B{b}")) for b in cfg.budgets]
        cells += [_f(row.get(f"tokens{b}"), 0) for b in cfg.budgets]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def split_rows(run: LocomoRun) -> list[tuple[str, set[str]]]:
    """(title, sample ids) of the tune split (the first `tune_conversations` conversations: the
    only ones any setting may be tuned on) and the check split (the rest)."""
    ids = [c.sample_id for c in run.conversations]
    n = run.config.tune_conversations
    out = []
    if ids[:n]:
        out.append((f"tune split (conversations 0-{min(n, len(ids)) - 1})", set(ids[:n])))
    if ids[n:]:
        out.append((f"check split (conversations {n}-{len(ids) - 1})", set(ids[n:])))
    return out


def category_table(run: LocomoRun, sample_ids: set[str] | None = None) -> str:
    """Per category: contextd (build-prompt, and the memory tool's recall when the run asked
    it) next to plain BM25 over single turns on the same questions, at every R@k and budget;
    `sample_ids` restricts the table to those conversations."""
    cfg = run.config

    def keep(rows: Sequence[QuestionResult]) -> list[QuestionResult]:
        return [r for r in rows if sample_ids is None or r.sample_id in sample_ids]

    ours = summarise(keep(run.contextd), cfg.budgets, cfg.ks)
    tool = summarise(keep(run.tool), cfg.budgets, ()) if run.tool else None
    bm25 = summarise(keep(run.bm25), cfg.budgets, cfg.ks)
    trunc = summarise(keep(run.truncation), (0,), ())
    names = [CATEGORIES[c] for c in SCORED_CATEGORIES] + ["overall", CATEGORIES[5]]
    head = ["category", "n"]
    for k in cfg.ks:
        head += [f"R@{k} contextd", f"R@{k} bm25"]
    for b in cfg.budgets:
        head += [f"B{b} contextd", f"B{b} recalled only", f"B{b} bm25"]
        head += [f"B{b} memory tool"] if tool is not None else []
    head += ["in window", "truncation"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        if name not in ours:
            continue
        o, m = ours[name], bm25.get(name, {})
        cells = [name, str(int(o["n"]))]
        for k in cfg.ks:
            cells += [_f(o.get(f"R@{k}")), _f(m.get(f"R@{k}"))]
        for b in cfg.budgets:
            cells += [_f(o.get(f"B{b}")), _f(o.get(f"B{b}_recalled")), _f(m.get(f"B{b}"))]
            if tool is not None:
                cells.append(_f(tool.get(name, {}).get(f"B{b}")))
        cells += [_f(o.get("in_window")), _f(trunc.get(name, {}).get("B0"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def split_tables(run: LocomoRun) -> str:
    """The per-category table of each split, titled."""
    return "\n\n".join(
        f"### {title}\n\n{category_table(run, ids)}" for title, ids in split_rows(run)
    )


def stage_latencies(builds: Sequence[BuildSample]) -> dict[str, list[float]]:
    builds = [b for b in builds if not b.error]
    stages: dict[str, list[float]] = {"client wall": [b.wall_ms for b in builds]}
    for b in builds:
        for stage, ms in b.timings_ms.items():
            stages.setdefault(stage, []).append(ms)
    return stages


def _stage_key(stage: str) -> tuple[int, str]:
    if stage == "client wall":
        return (3, stage)
    if stage == "total":
        return (2, stage)
    return (0 if not stage.startswith("recall_") else 1, stage)


def latency_table(builds: Sequence[BuildSample]) -> str:
    stages = stage_latencies(builds)
    lines = ["| stage | n | p50 ms | p95 ms | mean ms |", "|---|---|---|---|---|"]
    for stage in sorted(stages, key=_stage_key):
        values = stages[stage]
        lines.append(
            f"| {stage} | {len(values)} | {_f(percentile(values, 0.5), 2)} | "
            f"{_f(percentile(values, 0.95), 2)} | {_f(statistics.fmean(values), 2)} |"
        )
    return "\n".join(lines)


def fallback_table(builds: Sequence[BuildSample]) -> str:
    n = len(builds) or 1
    flags: dict[str, int] = {}
    for b in builds:
        for f in set(b.fallbacks):
            flags[f] = flags.get(f, 0) + 1
    degraded = sum(1 for b in builds if DEGRADED_FLAGS & set(b.fallbacks))
    errors = sum(1 for b in builds if b.error)
    lines = ["| flag | builds | rate |", "|---|---|---|"]
    lines.append(f"| **server error** (5xx, scored as recall 0) | {errors} | {errors / n:.3f} |")
    lines.append(f"| **degraded** (any of {', '.join(sorted(DEGRADED_FLAGS))}) | {degraded} | "
                 f"{degraded / n:.3f} |")  # fmt: skip
    for flag, count in sorted(flags.items()):
        lines.append(f"| {flag} | {count} | {count / n:.3f} |")
    return "\n".join(lines)


def write_plots(run: LocomoRun, out: Path) -> list[str]:
    """PNG plots; [] (and the report says so) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    cfg = run.config
    budgets = sorted(cfg.budgets)
    files = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, results in (
        ("contextd", run.contextd),
        ("bm25 single turns", run.bm25),
        ("bm25 framed", run.bm25_framed),
    ):
        overall = summarise(results, budgets, ()).get("overall", {})
        ax.plot(budgets, [overall.get(f"B{b}", math.nan) for b in budgets], "o-", label=name)
    trunc = summarise(run.truncation, (0,), ()).get("overall", {}).get("B0", math.nan)
    ax.axhline(trunc, color="grey", ls="--", label="truncation")
    ax.set_xlabel("injected recall budget B (tokens)")
    ax.set_ylabel("evidence recall (categories 1-4)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "evidence_recall_vs_budget.png", dpi=110)
    plt.close(fig)
    files.append("evidence_recall_vs_budget.png")

    stages = stage_latencies(run.builds)
    names = [*sorted((s for s in stages if s != "client wall"), key=_stage_key), "client wall"]
    if run.builds:
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [percentile(stages[n], 0.5) for n in names], 0.4, label="p50")
        ax.bar(
            [x + 0.2 for x in xs], [percentile(stages[n], 0.95) for n in names], 0.4, label="p95"
        )
        ax.set_xticks(list(xs), names, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("ms")
        ax.set_title("build-prompt latency per stage")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "latency_stages.png", dpi=110)
        plt.close(fig)
        files.append("latency_stages.png")
    return files


def _tool_section(run: LocomoRun) -> str:
    """The memory tool's calls: client latency and fallbacks ("" when the run made none)."""
    if not run.tool_calls:
        return ""
    walls = [c.wall_ms for c in run.tool_calls if not c.error]
    return f"""
Memory tool `recall` (client wall, the budgeted calls): p50 {_f(percentile(walls, 0.5), 2)} ms,
p95 {_f(percentile(walls, 0.95), 2)} ms (n={len(walls)}).

{fallback_table(run.tool_calls)}
"""


def render_report(run: LocomoRun, plots: Sequence[str], data_path: str, label: str = "") -> str:
    cfg = run.config
    conv_lines = [
        "| conversation | session | turns | chunks | mean chunk tokens | turns left in C1 |",
        "|---|---|---|---|---|---|",
    ]
    for c in run.conversations:
        conv_lines.append(
            f"| {c.sample_id} | `{c.session_id}` | {c.turns} | {c.chunks} | "
            f"{c.chunk_tokens_mean:.0f} | {c.window_turns} |"
        )
    dropped = "\n".join(f"- {sid}: `{raw}` → dropped `{part}`" for sid, raw, part in
                        run.evidence_dropped) or "- none"  # fmt: skip
    plot_md = (
        "\n".join(f"![{p}]({p})" for p in plots)
        or "(plots skipped: matplotlib missing; install the eval extra: "
        "pip install -e '.[eval]', as make does)"
    )
    return f"""# contextd — LoCoMo evidence recall

{datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")} · data `{data_path}` · server `{cfg.url}` ·
machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()} ·
run `{cfg.run_id}`, {run.elapsed_s:.0f}s{f" · {label}" if label else ""}

Protocol: each conversation is one session (`session_<n>` lists in order; content
`"<speaker>: <text>"` plus ` [image: <blip_caption>]`; dia_id and session date in turn metadata;
speaker_a as `user`, speaker_b as `assistant`). Session config: context_limit {cfg.context_limit},
reserve {cfg.reserve_tokens}, min_recent_turns {cfg.min_recent_turns}, min_recent_tokens
{cfg.min_recent_tokens}, target_ratio {cfg.target_ratio}; the eval waited until the worker had
offloaded{" and embedded every chunk" if cfg.wait_embedded else ""}. Each question (categories 1-4
scored; 5 reported apart) is a `build-prompt` with `recall: {{mode: always, budget_tokens: B,
top_k: {cfg.top_k}}}` and the question as query; included recall items are mapped back to dia_ids
through the seqs returned at ingestion. Recall@k reads the first k items of one build with budget
and context limit {RANKING_LIMIT:,} (the full ranking, regardless of budget).

- **B<n>**: evidence recall at an injected budget of n tokens = share of evidence dia_ids in the
  prompt: covered by an included recalled item *or* already in the C1 window (recall leaves window
  turns out by design). "recalled only" counts recalled items alone; "in window" is the share of
  evidence that sat in C1 (the last few turns of the conversation).
- Injected tokens: `usage.recall` (the recalled block with its frame and per-item headers).
- **memory tool** (with `--memory-tool`): the same question through the memory tool,
  `{{"type": "recall", "query": ..., "top_k": {cfg.top_k}, "budget_tokens": B}}`, scored like the
  build (its matches' turns, or the C1 window of the build at that budget); its tokens are those
  of the answer's text as the agent reads it.
- Baselines, offline on the same data: BM25 over single turns (k1 1.2, b .75,
  `app.domain.text.terms`: lower-cased words, English stopwords), a turn costing its content's
  tokens (README setting), and
  the same ranking charged like contextd's recalled block (frame + `[ts | turn | id]` header per
  item); truncation keeps the last turns that fit in C − r =
  {cfg.context_limit - cfg.reserve_tokens} tokens.
- Evidence ids: split on `;`, `,` and whitespace; `D:11:26` → `D11:26`; zero-padded turns
  (`D30:05` → `D30:5`); ids that do not parse or name no turn are dropped; questions left with no
  evidence are skipped ({run.questions_without_evidence} here).

## Overall (categories 1-4)

{summary_table(run)}

## Per category, all conversations

{category_table(run)}

## Per category and split (tune on the first, judge on the second)

{split_tables(run)}

{answer_section(run.answers, split_rows(run), cfg.answer_budget)}
{ablation_section(run.ablations, split_rows(run), cfg.answer_budget)}
## Latency (client and `timings_ms`, the budgeted builds; server on the same machine)

{latency_table(run.builds)}
{_tool_section(run)}
## Fallbacks

{fallback_table(run.builds)}

## Sessions

{chr(10).join(conv_lines)}

## Evidence ids dropped

{dropped}

## Reference

{REFERENCE}

## Plots

{plot_md}
"""


def write_report(run: LocomoRun, out: Path, data_path: str, label: str = "") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(run, out)
    path = out / "locomo_report.md"
    path.write_text(render_report(run, plots, data_path, label))
    return path
