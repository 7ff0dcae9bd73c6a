"""Scores of `contextd eval agent` (pure): each build contextd returned and the baselines' prompts
on the same steps, measured by the definitions of `app.eval.agent`, and their aggregates per
split, limit and system."""

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.domain.tokens import messages_tokens
from app.eval.agent import (
    Step,
    common_prefix,
    labelled,
    present,
    prompt_text,
    serial_tokens,
    validity_problems,
)
from app.eval.agent_baselines import clearing, full_history, truncation, turn_records
from app.eval.agent_driver import BuildObservation, Replay
from app.eval.locomo import percentile

SYSTEMS = ("contextd", "truncation", "clearing", "full")


@dataclass
class StepFigures:
    """One system's prompt at one step of one run at one limit."""

    system: str
    split: str
    task_id: int
    trial: int
    limit: int
    step: int  # the step's ordinal in its run
    available: int  # C - r
    dependencies: int
    present: int
    labelled: int
    tokens: int  # prompt tokens: usage.total for contextd, messages_tokens for the baselines
    serial_tokens: int  # tokens of the serialized prompt (prefix reuse's denominator)
    prefix_tokens: int | None  # shared with the session's previous build (None: first build)
    problems: list[str] = field(default_factory=list)  # validity; empty when valid
    latency_ms: float | None = None  # contextd only
    fallbacks: list[str] = field(default_factory=list)
    error: str | None = None  # contextd's build failed (scored as nothing present)
    missing: list[str] = field(default_factory=list)  # dependencies not present

    @property
    def retention(self) -> float | None:
        return self.present / self.dependencies if self.dependencies else None


def split_of(task_id: int, tune_tasks: Iterable[int]) -> str:
    return "tune" if task_id in set(tune_tasks) else "check"


def _measure(
    system: str,
    messages: list[dict[str, Any]] | None,
    step: Step,
    base: dict[str, Any],
    previous: list[int] | None,
) -> tuple[StepFigures, list[int] | None]:
    if messages is None:
        figures = StepFigures(
            system=system, **base, dependencies=len(step.dependencies), present=0, labelled=0,
            tokens=0, serial_tokens=0, prefix_tokens=None, missing=list(step.dependencies),
        )  # fmt: skip
        return figures, None
    text = prompt_text(messages)
    found = present(step.dependencies, text)
    serial = serial_tokens(messages)
    figures = StepFigures(
        system=system,
        **base,
        dependencies=len(step.dependencies),
        present=len(found),
        labelled=len(labelled(found, step.labels, messages)),
        tokens=messages_tokens(messages),
        serial_tokens=len(serial),
        prefix_tokens=common_prefix(previous, serial) if previous is not None else None,
        problems=validity_problems(messages),
        missing=[d for d in step.dependencies if d not in found],
    )
    return figures, serial


def score_replay(
    replay: Replay, available: int, tune_tasks: Iterable[int], clearing_keep: int = 3
) -> list[StepFigures]:
    """contextd's builds of one replay and the baselines at the same steps."""
    run = replay.run
    turns = turn_records(run.messages)
    by_ordinal: dict[int, BuildObservation] = {b.ordinal: b for b in replay.builds}
    previous: dict[str, list[int] | None] = dict.fromkeys(SYSTEMS)
    out: list[StepFigures] = []
    for step in run.steps:
        build = by_ordinal.get(step.ordinal)
        if build is None:
            continue  # never built: the replay stopped before this step
        base = {
            "split": split_of(run.task_id, tune_tasks),
            "task_id": run.task_id,
            "trial": run.trial,
            "limit": replay.limit,
            "step": step.ordinal,
            "available": available,
        }
        history = turns[: step.index]
        prompts = {
            "contextd": build.messages,
            "truncation": truncation(run.system, history, available),
            "clearing": clearing(run.system, history, available, clearing_keep),
            "full": full_history(run.system, history),
        }
        for system in SYSTEMS:
            figures, previous[system] = _measure(
                system, prompts[system], step, base, previous[system]
            )
            if system == "contextd":
                figures.tokens = build.tokens
                figures.latency_ms = build.wall_ms
                figures.fallbacks = build.fallbacks
                figures.error = build.error
            out.append(figures)
    return out


def summarise(figures: Sequence[StepFigures]) -> dict[str, float]:
    """Aggregates of one system's steps (one split and limit): retention and labelled retention
    as total present over total dependencies, and the per-step mean of retention over the steps
    with dependencies; tokens and budget share as means over the built prompts; prefix reuse as
    total shared over total tokens of the builds that had a previous build."""
    built = [f for f in figures if f.error is None]
    deps = sum(f.dependencies for f in figures)
    per_step = [r for f in figures if (r := f.retention) is not None]
    with_prev = [f for f in built if f.prefix_tokens is not None]
    later = sum(f.serial_tokens for f in with_prev)
    latencies = [f.latency_ms for f in figures if f.latency_ms is not None and f.error is None]
    nan = float("nan")
    return {
        "steps": len(figures),
        "steps_with_dependencies": len(per_step),
        "dependencies": deps,
        "present": sum(f.present for f in figures),
        "retention": sum(f.present for f in figures) / deps if deps else nan,
        "labelled_retention": sum(f.labelled for f in figures) / deps if deps else nan,
        "retention_step_mean": statistics.fmean(per_step) if per_step else nan,
        "tokens_mean": statistics.fmean(f.tokens for f in built) if built else nan,
        "tokens_max": max((f.tokens for f in built), default=0),
        "budget_share": statistics.fmean(f.tokens / f.available for f in built) if built else nan,
        "over_limit": sum(1 for f in built if f.tokens > f.available),
        "prefix_reuse": sum(f.prefix_tokens or 0 for f in with_prev) / later if later else nan,
        "invalid": sum(1 for f in built if f.problems),
        "errors": len(figures) - len(built),
        "latency_p50": percentile(latencies, 0.5) if latencies else nan,
        "latency_p95": percentile(latencies, 0.95) if latencies else nan,
    }


def flag_counts(figures: Iterable[StepFigures]) -> dict[str, int]:
    """How many builds carried each fallback flag."""
    counts: Counter[str] = Counter()
    for f in figures:
        counts.update(set(f.fallbacks))
    return dict(sorted(counts.items()))


def grouped(
    figures: Iterable[StepFigures],
) -> dict[tuple[str, int, str], list[StepFigures]]:
    """Figures by (split, limit, system)."""
    out: dict[tuple[str, int, str], list[StepFigures]] = {}
    for f in figures:
        out.setdefault((f.split, f.limit, f.system), []).append(f)
    return out
