"""The plots' inputs (`floor_compare --json`, `recall_scale --json` read into series) and the
bookkeeping of `floor_compare --clients`, without servers: a stand-in `floor_bench.py` with the
floor's shape (warm-up, then its own 1 and 16 clients per scenario) answers the sweep."""

import argparse
import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from benchmarks import recall_scale
from benchmarks.floor_compare import (
    CLIENTS,
    Figures,
    floor_command,
    floor_line,
    json_report,
    read_floor_line,
    summary,
    sweep_clients,
    sweep_schedule,
)
from benchmarks.plots import concurrency_series, error_bars, load_range, scale_series

SWEEP = (1, 2, 4, 8, 16)


def figures(side: float, round_: int, clients: tuple[int, ...]) -> Figures:
    """Made-up figures that name their side, round, scenario and concurrency."""
    return {
        (scenario, n): (side * n + round_ + bump, side * n * 3 + round_, 1000 / side - n - round_)
        for scenario, bump in (("no recall", 0.0), ("recall", 10.0))
        for n in clients
    }


def floor_report(clients: tuple[int, ...], n_rounds: int = 2) -> dict:
    """A `--json` report as floor_compare writes it (its own summary and writer), read back."""
    rounds = [(figures(1.0, r, clients), figures(2.0, r, clients)) for r in range(n_rounds)]
    speeds = [({key: 1.0 for key in f}, {key: 1.0 for key in c}) for f, c in rounds]
    cpus = [({key: {"server": 1.0} for key in f}, {key: {"server": 2.0} for key in c})
            for f, c in rounds]  # fmt: skip
    loads = [(1.25, 1.0, 1.0), (0.5, 1.0, 1.0)][:n_rounds]
    text = json_report(rounds, summary(rounds, speeds), loads, 948, [], cpus)
    return json.loads(text)


def test_the_sweep_s_rows_become_one_series_per_scenario_and_side() -> None:
    series = concurrency_series(floor_report(SWEEP))
    assert set(series) == {
        (s, side) for s in ("no recall", "recall") for side in ("floor", "contextd")
    }
    floor, contextd = series[("recall", "floor")], series[("recall", "contextd")]
    assert floor.x == contextd.x == [1, 2, 4, 8, 16]
    # p50 of round r at n clients: side * n + r + 10 (recall); the median of rounds 0 and 1.
    assert contextd.p50 == [2 * n + 10.5 for n in SWEEP]
    assert contextd.p50_low == [2 * n + 10 for n in SWEEP]
    assert contextd.p50_high == [2 * n + 11 for n in SWEEP]
    assert floor.p95 == [3 * n + 0.5 for n in SWEEP]
    assert floor.rps == [1000 - n - 0.5 for n in SWEEP]
    assert floor.rps_low == [1000 - n - 1 for n in SWEEP]
    assert floor.rps_high == [1000 - n for n in SWEEP]
    assert series[("no recall", "contextd")].p50 == [2 * n + 0.5 for n in SWEEP]


def test_the_default_report_plots_its_two_concurrencies() -> None:
    series = concurrency_series(floor_report(CLIENTS, n_rounds=1))
    assert series[("no recall", "floor")].x == [1, 16]
    assert series[("no recall", "floor")].p50_low == series[("no recall", "floor")].p50
    assert series[("no recall", "floor")].p50 == [1.0, 16.0]


def test_a_no_recall_only_report_has_no_recall_series() -> None:
    data = floor_report(CLIENTS)
    data["summary"] = [r for r in data["summary"] if r["scenario"] == "no recall"]
    assert {scenario for scenario, _ in concurrency_series(data)} == {"no recall"}


def test_load_range_reads_the_one_minute_averages() -> None:
    assert load_range(floor_report(CLIENTS)) == "0.5-1.2"
    assert load_range(floor_report(CLIENTS, n_rounds=1)) == "1.2"
    assert load_range({}) == "not recorded"


def test_error_bars_are_distances_below_and_above() -> None:
    assert error_bars([2.0, 5.0], [1.5, 5.0], [3.0, 6.5]) == [[0.5, 0.0], [1.0, 1.5]]


def scale_point(walls: list[list[float]]) -> dict:
    rounds = [
        {"walls": w, "stages": {"total": [1.0]}, "fallbacks": {}, "recalled": 3} for w in walls
    ]
    return {"load_s": 1.0} | recall_scale.summary(rounds)


def test_recall_scale_points_become_series_sorted_by_size() -> None:
    out = {
        "chunks": {
            100_000: scale_point([[30.0, 32.0, 34.0], [40.0, 42.0, 44.0]]),
            1000: scale_point([[20.0, 21.0, 22.0], [24.0, 25.0, 26.0]]),
        },
        "sessions": {100: scale_point([[10.0, 11.0, 12.0]])},
    }
    data = json.loads(json.dumps(out))  # as the file holds it: sizes as text
    chunks = scale_series(data, "chunks")
    assert chunks is not None
    assert chunks.x == [1000, 100_000]
    assert chunks.p50_low == [21.0, 32.0]
    assert chunks.p50_high == [25.0, 42.0]
    assert chunks.p50 == [out["chunks"][1000]["p50"], out["chunks"][100_000]["p50"]]
    assert chunks.p95 == [out["chunks"][1000]["p95"], out["chunks"][100_000]["p95"]]
    assert chunks.rps is None
    sessions = scale_series(data, "sessions")
    assert sessions is not None and sessions.x == [100]
    assert scale_series({"chunks": data["chunks"]}, "sessions") is None


def test_clients_always_hold_the_floor_s_own() -> None:
    assert sweep_clients("8,2,4") == (1, 2, 4, 8, 16)
    assert sweep_clients("16,1") == CLIENTS
    assert sweep_clients("32, 4") == (1, 4, 16, 32)
    for bad in ("0,4", "two", "4;8"):
        with pytest.raises(argparse.ArgumentTypeError):
            sweep_clients(bad)


def test_the_sweep_runs_in_ascending_order_at_the_floor_s_16() -> None:
    clients = (1, 2, 4, 8, 16, 32)
    assert sweep_schedule(clients, 16) == (2, 4, 8, 16, 32)
    assert sweep_schedule(clients, 1) == (1,)
    assert sweep_schedule(clients, 4) == (4,)  # the floor's warm-up is not swept
    assert sweep_schedule(CLIENTS, 16) == (16,)


def test_a_figure_printed_twice_is_read_once_and_other_scenarios_not_at_all() -> None:
    read: Figures = {}
    line = floor_line("recall", 4, (18.234, 25.5, 61.7))
    assert read_floor_line(line, ("recall",), read) == ("recall", 4)
    assert read == {("recall", 4): (18.23, 25.5, 62.0)}
    again = floor_line("recall", 4, (99.0, 99.0, 99.0))
    assert read_floor_line(again, ("recall",), read) is None
    assert read_floor_line(floor_line("no recall", 4, (1, 2, 3)), ("recall",), read) is None
    assert read_floor_line("loading 948 chunks", ("recall",), read) is None
    assert read == {("recall", 4): (18.23, 25.5, 62.0)}


def test_the_default_runs_floor_bench_as_it_is(tmp_path: Path) -> None:
    command = floor_command(tmp_path, 948, 240, CLIENTS)
    assert command[1:] == [str(tmp_path / "floor_bench.py"), "--chunks", "948", "--requests", "240"]


# The floor's shape: warm-up at 4 clients, then its own 1 and 16 per scenario, each printed as
# `floor_bench.py` prints it. Its `load` answers with figures that name the concurrency it was
# really called at, and says so on stdout.
STAND_IN = """
import argparse, asyncio

async def load(client, path_of, conc, n):
    print(f"load {path_of(0)} clients={conc} n={n}", flush=True)
    return float(conc), 2.0 * conc, 100.0 * conc

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int)
    ap.add_argument("--requests", type=int)
    args = ap.parse_args()
    print(f"chunks {args.chunks}", flush=True)

    async def run():
        for name, path_of in (("no recall", lambda j: f"/floor/s{j % 200}"),
                              ("recall", lambda j: "/floor_recall/s0")):
            await load(None, path_of, 4, 60)
            for conc in (1, 16):
                p50, p95, rps = await load(None, path_of, conc, args.requests)
                print(f"floor {name:9s} clients={conc:2d}  p50 {p50:6.2f} ms  "
                      f"p95 {p95:6.2f} ms  {rps:6.0f} req/s")
    asyncio.run(run())

if __name__ == "__main__":
    main()
"""


def test_the_sweep_measures_every_concurrency_with_the_floor_s_own_load(tmp_path: Path) -> None:
    (tmp_path / "floor_bench.py").write_text(textwrap.dedent(STAND_IN))
    clients = (1, 2, 4, 8, 16, 32)
    done = subprocess.run(
        floor_command(tmp_path, 948, 40, clients), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "chunks 948"
    calls = [line for line in lines if line.startswith("load ")]
    for path in ("/floor/s0", "/floor_recall/s0"):
        assert [c.split(" ", 2)[2] for c in calls if c.split()[1] == path] == [
            "clients=4 n=60",  # the floor's warm-up, as it is
            *(f"clients={n} n=40" for n in clients),
        ]
    read: Figures = {}
    keys = [read_floor_line(line, ("no recall", "recall"), read) for line in lines]
    assert [k for k in keys if k] == [(s, n) for s in ("no recall", "recall") for n in clients]
    assert read == {
        (s, n): (n, 2.0 * n, 100.0 * n) for s in ("no recall", "recall") for n in clients
    }
