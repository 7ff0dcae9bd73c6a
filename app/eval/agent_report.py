"""Markdown report, PNG plot and JSON figures of `contextd eval agent`."""

import json
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.eval.agent_driver import AgentEvalConfig, Replay
from app.eval.agent_score import SYSTEMS, StepFigures, flag_counts, grouped, summarise

SPLITS = ("tune", "check")
SYSTEM_NAMES = {
    "contextd": "contextd",
    "truncation": "truncation",
    "clearing": "clearing, keep 3",
    "full": "full history",
}
REPORT_NAME = "agent_report.md"
JSON_NAME = "agent_results.json"
PLOT_NAME = "agent_retention_vs_limit.png"

DEFINITIONS = """\
- **Step**: an assistant message that calls tools. Before it, the session holds every message
  before it (each appended as its own turn) and the prompt is built with the system prompt and
  no query, as `examples/python/agent_loop.py` does.
- **Dependencies** of a step: the leaf values of its calls' JSON arguments (numbers as their
  text; booleans and null left out) of at least 4 characters that are a substring of an earlier
  `tool` message and of neither the system prompt nor an earlier user message — values the agent
  can only have read from a tool result. Each distinct value counts once a step.
- **Retention**: dependencies that are substrings of the prompt's text (every message's content,
  every tool call's name and arguments), over all dependencies of the split's steps (total
  present / total); "per step" is the mean of each step's share over steps with dependencies.
- **Labelled retention**: a dependency counts only when the prompt holds it with what it is:
  (a) inside a `tool` message whose content is a JSON object or array holding it under a key, or
  (b) on one line of any message (a tool call is one line `name arguments`) after one of its
  labels (whole word, any case): the JSON keys it was found under in the earlier tool results
  (nearest key) and the names of the tools whose results held it.
- **Tokens**: contextd's `usage.total`; the baselines' prompts counted with
  `app.domain.tokens.messages_tokens`, the server's counter. **Budget share**: tokens / (C - 500),
  mean over builds; **over limit**: builds above C - 500 (full history is, by construction).
- **Prefix reuse**: for each build after the first of a session, the tokens its serialized
  prompt (each message's wire fields as JSON, in order) shares from the start with the previous
  build's, compared as cl100k token sequences; total shared / total tokens of those builds — what
  a provider's prompt cache can reuse.
- **Invalid**: prompts a provider would reject: a `tool` message not right after the assistant
  message holding its call (or a sibling result), a call not answered before the next non-tool
  message or at the end, a call id repeated in one message.
- **Latency**: build-prompt HTTP wall time seen by the client (contextd only). **Flags**: builds
  carrying each `fallbacks` flag.
- **Baselines**, computed locally on the same steps: full history (system + every message so
  far); truncation (system + the newest messages that fit C - 500, cut only between groups that
  keep each call with its results); clearing keep 3 (every tool result but the 3 newest replaced
  by `[tool result cleared]`, then truncation), like Anthropic's `clear_tool_uses` and
  LangChain's `ClearToolUsesEdit`.
- Nothing waits for the worker between steps (an agent does not): offloads and notes land when
  the worker gets to them, so contextd's figures move a little from one run of the eval to the
  next. A run whose append the server refuses (4xx) stops there ("rejected at append"); its
  steps built before are scored, for every system on the same steps."""


@dataclass
class AgentEvalResult:
    config: AgentEvalConfig
    replays: list[Replay]
    figures: list[StepFigures]
    elapsed_s: float


def _f(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{value:.{digits}f}"
    return text[1:] if digits == 3 and text.startswith("0.") else text


def headline_table(result: AgentEvalResult) -> str:
    """Retention (labelled) per limit and split, the systems side by side."""
    groups = grouped(result.figures)
    head = ["C", "split", "steps", *(SYSTEM_NAMES[s] for s in SYSTEMS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for limit in result.config.limits:
        for split in SPLITS:
            rows = {s: summarise(groups.get((split, limit, s), [])) for s in SYSTEMS}
            if not rows["contextd"]["steps"]:
                continue
            cells = [f"{limit:,}", split, str(rows["contextd"]["steps"])]
            cells += [
                f"{_f(rows[s]['retention'])} ({_f(rows[s]['labelled_retention'])})" for s in SYSTEMS
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(result: AgentEvalResult, split: str, limit: int) -> str:
    groups = grouped(result.figures)
    head = ["system", "steps", "deps", "retention", "labelled", "per step", "tokens mean",
            "tokens max", "budget share", "over limit", "prefix reuse", "invalid",
            "build errors", "p50 ms", "p95 ms", "flags"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system in SYSTEMS:
        rows = groups.get((split, limit, system), [])
        if not rows:
            continue
        s = summarise(rows)
        flags = ", ".join(f"{k} {v}" for k, v in flag_counts(rows).items()) or "–"
        cells = [
            SYSTEM_NAMES[system], str(s["steps"]), str(s["dependencies"]), _f(s["retention"]),
            _f(s["labelled_retention"]), _f(s["retention_step_mean"]), _f(s["tokens_mean"], 0),
            str(s["tokens_max"]), _f(s["budget_share"]), str(s["over_limit"]),
            _f(s["prefix_reuse"]), str(s["invalid"]), str(s["errors"]),
            _f(s["latency_p50"], 1), _f(s["latency_p95"], 1), flags,
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rejection_table(result: AgentEvalResult) -> str:
    lines = ["| C | split | runs | rejected at append | steps not built | first refusals |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    tune = set(result.config.tune_tasks)
    for limit in result.config.limits:
        for split in SPLITS:
            replays = [
                r for r in result.replays
                if r.limit == limit and (r.run.task_id in tune) == (split == "tune")
            ]  # fmt: skip
            if not replays:
                continue
            rejected = [r for r in replays if r.rejection]
            unbuilt = sum(len(r.run.steps) - len(r.builds) for r in replays)
            examples = "; ".join(
                f"{r.run.key} msg {r.rejection.message_index} ({r.rejection.role}): "
                f"{r.rejection.status} {r.rejection.code}"
                for r in rejected[:3]
                if r.rejection
            )
            lines.append(
                f"| {limit:,} | {split} | {len(replays)} | {len(rejected)} | {unbuilt} | "
                f"{examples or '–'} |"
            )
    return "\n".join(lines)


def _examples(result: AgentEvalResult) -> tuple[list[str], list[str]]:
    invalid = [
        f"- {f.system}, C {f.limit:,}, t{f.task_id}-r{f.trial} step {f.step}: "
        + "; ".join(f.problems[:3])
        for f in result.figures
        if f.problems and f.error is None
    ][:8]
    missing = [
        f"- C {f.limit:,}, t{f.task_id}-r{f.trial} step {f.step}: "
        + ", ".join(f"`{m}`" for m in f.missing)
        for f in result.figures
        if f.system == "contextd" and f.missing
    ][:12]
    return invalid, missing


def write_plot(result: AgentEvalResult, out: Path) -> list[str]:
    """Retention and labelled retention against the limit, a panel per split; [] (the report
    says so) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    groups = grouped(result.figures)
    limits = sorted(result.config.limits)
    splits = [s for s in SPLITS if any(k[0] == s for k in groups)]
    if not splits:
        return []
    fig, axes = plt.subplots(1, len(splits), figsize=(5.2 * len(splits), 4), squeeze=False)
    for ax, split in zip(axes[0], splits, strict=True):
        for system, colour in zip(SYSTEMS, ("tab:blue", "tab:orange", "tab:green", "tab:grey"),
                                  strict=True):  # fmt: skip
            rows = [summarise(groups.get((split, c, system), [])) for c in limits]
            ax.plot(limits, [r["retention"] for r in rows], "o-", color=colour,
                    label=SYSTEM_NAMES[system])  # fmt: skip
            if system != "full":
                ax.plot(limits, [r["labelled_retention"] for r in rows], "^:", color=colour,
                        label=f"{SYSTEM_NAMES[system]}, labelled")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xticks(limits, [f"{c:,}" for c in limits])
        ax.minorticks_off()  # the log axis's own 3x10^3 labels would overprint the limits
        ax.set_xlabel("context limit C (tokens, reserve 500)")
        ax.set_ylabel("dependency retention")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{split} split", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"tool-call dependencies kept in the prompt — run {result.config.run_id}",
                 fontsize=11)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out / PLOT_NAME, dpi=90)
    plt.close(fig)
    return [PLOT_NAME]


def render_report(
    result: AgentEvalResult, plots: Sequence[str], data_path: str, label: str = ""
) -> str:
    cfg = result.config
    tune = set(cfg.tune_tasks)
    runs = {r.run.key: r.run for r in result.replays}
    tune_runs = sum(1 for r in runs.values() if r.task_id in tune)
    invalid, missing = _examples(result)
    details = "\n\n".join(
        f"### {split} split, C {limit:,}\n\n{detail_table(result, split, limit)}"
        for split in SPLITS
        for limit in cfg.limits
        if any(f.split == split and f.limit == limit for f in result.figures)
    )
    plot_md = (
        "\n".join(f"![{p}]({p})" for p in plots)
        or "(plot skipped: matplotlib missing; install the eval extra: "
        "pip install -e '.[eval]', as make does)"
    )
    suffix = f" · {label}" if label else ""
    limits = ", ".join(f"{c:,}" for c in cfg.limits)
    return f"""# contextd — tool-calling agents: what the next call needs

{datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")} · data `{data_path}` · server `{cfg.url}` ·
machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()} ·
run `{cfg.run_id}`, {result.elapsed_s:.0f}s, concurrency {cfg.concurrency}{suffix}

{len(runs)} runs ({tune_runs} in the tune split: tasks {_ranges(cfg.tune_tasks)};
{len(runs) - tune_runs} in the check split: the other tasks), limits {limits}, reserve
{cfg.reserve_tokens}, a fresh session per run and limit.

## Definitions

{DEFINITIONS}

## Retention (labelled) per limit and split

{headline_table(result)}

## Per split and limit

{details}

## Rejected at append

{rejection_table(result)}

## Invalid prompts (examples)

{chr(10).join(invalid) or "- none"}

## Dependencies missing from contextd's prompt (examples)

{chr(10).join(missing) or "- none"}

## Plot

{plot_md}
"""


def _ranges(values: Sequence[int]) -> str:
    ordered = sorted(set(values))
    if not ordered:
        return "none"
    parts, start, prev = [], ordered[0], ordered[0]
    for v in [*ordered[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}-{prev}" if start != prev else str(start))
        if v is not None:
            start = prev = v
    return ",".join(parts)


def results_json(result: AgentEvalResult) -> dict[str, Any]:
    """Config, aggregates per split/limit/system, rejections and every step's figures."""
    groups = grouped(result.figures)
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for (split, limit, system), rows in groups.items():
        entry = summarise(rows) | {"flags": flag_counts(rows)}
        summary.setdefault(split, {}).setdefault(str(limit), {})[system] = {
            k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in entry.items()
        }
    cfg = asdict(result.config)
    return {
        "config": cfg,
        "elapsed_s": result.elapsed_s,
        "summary": summary,
        "replays": [
            {
                "run": r.run.key,
                "limit": r.limit,
                "session_id": r.session_id,
                "builds": len(r.builds),
                "steps": len(r.run.steps),
                "appended": r.appended,
                "rejection": asdict(r.rejection) if r.rejection else None,
            }
            for r in result.replays
        ],
        "steps": [asdict(f) for f in result.figures],
    }


def write_report(
    result: AgentEvalResult, out: Path, data_path: str, label: str = ""
) -> tuple[Path, Path]:
    """The Markdown report (with its plot) and the JSON figures in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plot(result, out)
    report = out / REPORT_NAME
    report.write_text(render_report(result, plots, data_path, label))
    figures = out / JSON_NAME
    figures.write_text(json.dumps(results_json(result), indent=1, ensure_ascii=False))
    return report, figures
