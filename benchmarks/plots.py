"""PNG plots of the figures `floor_compare --json` and `recall_scale --json` write (#12).

    .venv/bin/python -m benchmarks.plots [--floor floor.json] [--scale scale.json ...]
        [--out docs/img] [--floor-commit abc1234] [--scale-commit abc1234] [--machine "2 cores"]

Needs matplotlib (`pip install -e '.[eval]'`). Writes to `--out`:
  concurrency_latency.png     p50 and p95 against concurrent clients, contextd and the floor, with
                              and without recall (log-log; bars: the range of the rounds' p50s)
  concurrency_throughput.png  req/s against concurrent clients, the same sides and scenarios
  scale_chunks.png            recall p50 and p95 against chunks in the session (log x), with
                              #12's target (p50 at most 1.5x the p50 at 10^3 chunks)
  scale_sessions.png          the same against sessions in the database (target: 1.2x 10^2)
Each title names the machine and the commit measured (`--floor-commit`, `--scale-commit`; this
checkout's HEAD when not given), each caption how it was measured (rounds, and the load average
`floor_compare` recorded).
"""

import argparse
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.floor_compare import SCENARIOS

SIDES = ("floor", "contextd")
COLOURS = {"floor": "tab:grey", "contextd": "tab:blue"}
SCALE_AXES = {
    "chunks": "chunks in the session",
    "sessions": "sessions in the database (measured session: 1,000 chunks)",
}
# #12's targets: p50 at 10^5 chunks at most 1.5x the p50 at 10^3; at 10^5 sessions, 1.2x 10^2.
SCALE_TARGETS = {"chunks": (1000, 1.5), "sessions": (100, 1.2)}


@dataclass(frozen=True)
class Series:
    """One line of a plot: x ascending, and per x the medians over rounds and the rounds' range."""

    x: list[int]
    p50: list[float]
    p95: list[float]
    p50_low: list[float]  # the lowest of the rounds' p50s
    p50_high: list[float]
    rps: list[float] | None = None  # req/s (floor_compare only)
    rps_low: list[float] | None = None
    rps_high: list[float] | None = None


def concurrency_series(data: dict[str, Any]) -> dict[tuple[str, str], Series]:
    """(scenario, side) -> its figures against clients, from `floor_compare --json`: the medians
    of `summary`, the ranges from `rounds` (each round: [floor items, contextd items], an item
    [[scenario, clients], [p50, p95, req/s]])."""
    per_round: dict[tuple[str, str, int], list[list[float]]] = {}
    for sides in data["rounds"]:
        for side, items in zip(SIDES, sides, strict=True):
            for (scenario, clients), figures in items:
                per_round.setdefault((scenario, side, clients), []).append(figures)
    out = {}
    for scenario in SCENARIOS:
        rows = sorted(
            (r for r in data["summary"] if r["scenario"] == scenario), key=lambda r: r["clients"]
        )
        if not rows:
            continue
        for side in SIDES:
            rounds = [per_round[(scenario, side, r["clients"])] for r in rows]
            out[(scenario, side)] = Series(
                x=[r["clients"] for r in rows],
                p50=[r[f"{side}_p50"] for r in rows],
                p95=[r[f"{side}_p95"] for r in rows],
                p50_low=[min(f[0] for f in figs) for figs in rounds],
                p50_high=[max(f[0] for f in figs) for figs in rounds],
                rps=[r[f"{side}_rps"] for r in rows],
                rps_low=[min(f[2] for f in figs) for figs in rounds],
                rps_high=[max(f[2] for f in figs) for figs in rounds],
            )
    return out


def scale_series(data: dict[str, Any], axis: str) -> Series | None:
    """contextd's recall figures against `axis` ("chunks" or "sessions") from `recall_scale
    --json` (points keyed by size, as text in JSON); None when the run left that axis out."""
    points = sorted((int(size), point) for size, point in data.get(axis, {}).items())
    if not points:
        return None
    return Series(
        x=[size for size, _ in points],
        p50=[point["p50"] for _, point in points],
        p95=[point["p95"] for _, point in points],
        p50_low=[min(point["round_p50"]) for _, point in points],
        p50_high=[max(point["round_p50"]) for _, point in points],
    )


def load_range(data: dict[str, Any]) -> str:
    """The 1-minute load averages `floor_compare` recorded before each round, as "a-b"."""
    loads = [round(load[0], 1) for load in data.get("loadavg", [])]
    if not loads:
        return "not recorded"
    low, high = min(loads), max(loads)
    return f"{low:.1f}" if low == high else f"{low:.1f}-{high:.1f}"


def head_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "benchmarks.plots needs matplotlib: pip install -e '.[eval]' (the eval extra)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def error_bars(mid: list[float], low: list[float], high: list[float]) -> list[list[float]]:
    """matplotlib's asymmetric error bars: the distances below and above each point."""
    return [
        [m - lo for m, lo in zip(mid, low, strict=True)],
        [hi - m for m, hi in zip(mid, high, strict=True)],
    ]


def _save(plt: Any, fig: Any, path: Path, caption: str) -> None:
    fig.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"{path}  {path.stat().st_size // 1024} KB")


def _legend(ax: Any) -> None:
    """The legend with every p50 before the p95s, a target last."""
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: ("target" in labels[i], "p95" in labels[i]))
    ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=7)


def _plain_log_y(ax: Any) -> None:
    """A log y axis labelled 1, 2, 5, 10, 20 ... (not 2x10^1)."""
    from matplotlib import ticker

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _latency(ax: Any, s: Series, side: str) -> None:
    bars = error_bars(s.p50, s.p50_low, s.p50_high)
    colour = COLOURS[side]
    ax.errorbar(
        s.x, s.p50, yerr=bars, color=colour, marker="o", ms=4, capsize=3, label=f"{side} p50"
    )
    ax.plot(s.x, s.p95, color=colour, ls="--", marker="^", ms=4, label=f"{side} p95")


def _throughput(ax: Any, s: Series, side: str) -> None:
    assert s.rps is not None and s.rps_low is not None and s.rps_high is not None
    bars = error_bars(s.rps, s.rps_low, s.rps_high)
    ax.errorbar(s.x, s.rps, yerr=bars, color=COLOURS[side], marker="o", ms=4, capsize=3, label=side)


def plot_concurrency(data: dict[str, Any], out: Path, commit: str, machine: str) -> list[Path]:
    """concurrency_latency.png and concurrency_throughput.png: a panel per scenario."""
    plt = _pyplot()
    series = concurrency_series(data)
    scenarios = [s for s in SCENARIOS if (s, "floor") in series]
    caption = (
        f"floor_compare: medians of {len(data['rounds'])} round(s), distinct queries, bars: the "
        f"rounds' range; load average {load_range(data)}; {machine}; contextd {commit}"
    )
    paths = []
    for name, draw in (("latency", _latency), ("throughput", _throughput)):
        fig, axes = plt.subplots(
            1, len(scenarios), figsize=(4.2 * len(scenarios), 3.6), squeeze=False
        )
        for ax, scenario in zip(axes[0], scenarios, strict=True):
            for side in SIDES:
                draw(ax, series[(scenario, side)], side)
            if name == "latency":
                _plain_log_y(ax)
                ax.set_ylabel("latency per request (ms, log)")
            else:
                ax.set_ylim(bottom=0)
                ax.set_ylabel("requests/s")
            clients = series[(scenario, "floor")].x
            ax.set_xscale("log", base=2)
            ax.set_xticks(clients, [str(x) for x in clients])
            ax.set_xlabel("concurrent clients")
            ax.set_title(f"build-prompt, {scenario}", fontsize=10)
            ax.grid(alpha=0.3, which="both")
            _legend(ax)
        fig.suptitle(f"contextd against the floor — {machine}, {commit}", fontsize=11)
        path = out / f"concurrency_{name}.png"
        _save(plt, fig, path, caption)
        paths.append(path)
    return paths


def plot_scale(data: dict[str, Any], out: Path, commit: str, machine: str) -> list[Path]:
    plt = _pyplot()
    paths = []
    for axis, xlabel in SCALE_AXES.items():
        s = scale_series(data, axis)
        if s is None:
            continue
        rounds = len(next(iter(data[axis].values()))["round_p50"])
        fig, ax = plt.subplots(figsize=(5.2, 3.6))
        _latency(ax, s, "contextd")
        base, ratio = SCALE_TARGETS[axis]
        if base in s.x:
            target = ratio * s.p50[s.x.index(base)]
            ax.axhline(
                target,
                color="tab:red",
                ls=":",
                lw=1,
                label=f"target: p50 {ratio}x the p50 at {base:,}",
            )
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("build-prompt with recall, client wall (ms)")
        ax.grid(alpha=0.3, which="both")
        _legend(ax)
        ax.set_title(f"recall as history grows — {machine}\n{commit}", fontsize=10)
        path = out / f"scale_{axis}.png"
        caption = (
            f"recall_scale: 1 client, {rounds} interleaved round(s), distinct queries, bars: the "
            f"rounds' p50 range; {machine}"
        )
        _save(plt, fig, path, caption)
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor", type=Path, help="a `floor_compare --json` file")
    parser.add_argument(
        "--scale",
        type=Path,
        nargs="+",
        help="`recall_scale --json` files (one run with both axes, or one per axis)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    parser.add_argument("--floor-commit", help="the commit floor_compare measured (default HEAD)")
    parser.add_argument("--scale-commit", help="the commit recall_scale measured (default HEAD)")
    parser.add_argument("--machine", default=f"{os.cpu_count()} cores")
    args = parser.parse_args()
    if not args.floor and not args.scale:
        parser.error("nothing to plot: give --floor and/or --scale")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.floor:
        data = json.loads(args.floor.read_text())
        plot_concurrency(data, args.out, args.floor_commit or head_commit(), args.machine)
    if args.scale:
        data = {}
        for path in args.scale:
            data |= json.loads(path.read_text())
        plot_scale(data, args.out, args.scale_commit or head_commit(), args.machine)


if __name__ == "__main__":
    main()
