"""`contextd eval agent` end to end against a real server with its worker: synthetic tool-calling
runs in the tau-bench shape, one limit, the report and its JSON checked."""

import json
from pathlib import Path
from typing import Any

from app.core.config import Settings
from app.eval.agent import load_runs
from app.runtime.cli import main
from tests.support.server import run_server

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py

POLICY = " ".join(
    f"Rule {i}: confirm the booking details with the user before any update, and never change "
    f"a basic economy flight ({i} of 40)."
    for i in range(40)
)
TURN_LIMIT_BYTES = 8192  # the rejected run's tool result is larger


def _call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def _result(call_id: str, name: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": json.dumps(content)}


def synthetic_run(task_id: int, oversized: bool = False) -> dict[str, Any]:
    """A user with six reservations: each looked up, then the flights of the first ones changed
    (their flight numbers read from tool results many steps back)."""
    user = f"user_{task_id}_4821"
    ids = [f"R{task_id}X{k}Q" for k in range(6)]
    traj: list[dict[str, Any]] = [
        {"role": "system", "content": POLICY},
        {"role": "user", "content": f"Hi, I am {user}; please move my flights to later ones."},
        _call("call_u", "get_user_details", user_id=user),
        _result("call_u", "get_user_details", {"user_id": user, "reservations": ids}),
    ]
    for k, rid in enumerate(ids):
        segments = [
            {
                "flight_number": f"HAT{task_id}{k}{n}",
                "date": f"2024-05-{10 + k:02d}",
                "price": 100 + n,
            }
            for n in range(8)
        ]
        details = {"reservation_id": rid, "status": "confirmed", "flights": segments}
        if oversized and k == 3:
            details["log"] = "x" * (TURN_LIMIT_BYTES + 100)
        traj += [
            _call(f"call_r{k}", "get_reservation_details", reservation_id=rid),
            _result(f"call_r{k}", "get_reservation_details", details),
            {"role": "assistant", "content": f"Reservation {k + 1} of {len(ids)} checked."},
        ]
    traj.append({"role": "user", "content": "Yes, change the first two as discussed."})
    for k in range(2):
        flight = f"HAT{task_id}{k}2"
        traj += [
            _call(f"call_c{k}", "update_reservation_flights", reservation_id=ids[k], flight=flight),
            _result(f"call_c{k}", "update_reservation_flights", {"ok": True, "flight": flight}),
        ]
    traj.append({"role": "assistant", "content": "Both are changed."})
    return {"task_id": task_id, "trial": 0, "reward": 1.0, "info": {}, "traj": traj}


def test_eval_agent_writes_a_report(
    settings: Settings, api_key: str, tmp_path: Path, capsys: Any
) -> None:
    data = tmp_path / "trajectories.json"
    data.write_text(
        json.dumps([synthetic_run(3), synthetic_run(15), synthetic_run(16, oversized=True)])
    )
    runs = {r.task_id: r for r in load_runs(data)}
    steps = {task: len(run.steps) for task, run in runs.items()}
    assert steps == {3: 9, 15: 9, 16: 9}
    assert sum(len(s.dependencies) for s in runs[3].steps) >= 4
    out = tmp_path / "report"
    small_turns = settings.limits.model_copy(
        update={"max_turn_bytes": TURN_LIMIT_BYTES, "max_tool_result_bytes": TURN_LIMIT_BYTES}
    )
    with run_server(settings.model_copy(update={"limits": small_turns}), with_worker=True) as srv:
        code = main(
            [
                "eval", "agent", "--data", str(data), "--url", srv.url, "--api-key", api_key,
                "--out", str(out), "--limits", "3500", "--tasks", "0-24", "--trials", "0",
            ]
        )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr()
    assert "| 3,500 | tune | 9 |" in printed.out
    assert "runs replayed: 3/3 (100%)" in printed.err  # progress on stderr, results on stdout
    assert "runs replayed" not in printed.out

    results = json.loads((out / "agent_results.json").read_text())
    tune, check = results["summary"]["tune"]["3500"], results["summary"]["check"]["3500"]
    # The oversized run is refused at its 4th lookup's result, after 5 builds (user, 4 lookups).
    rejected = [r for r in results["replays"] if r["rejection"]]
    assert [(r["run"], r["rejection"]["status"], r["builds"]) for r in rejected] == [
        ("t16-r0", 413, 5)
    ]
    assert rejected[0]["rejection"]["message_index"] == 13  # after the system prompt
    assert tune["contextd"]["steps"] == 9 and check["contextd"]["steps"] == 9 + 5
    assert len(results["steps"]) == 4 * (9 + 9 + 5)
    for split in (tune, check):
        for system in ("contextd", "truncation", "clearing", "full"):
            row = split[system]
            assert row["steps"] == split["contextd"]["steps"]
            assert row["dependencies"] == split["contextd"]["dependencies"] > 0
            assert 0.0 <= row["labelled_retention"] <= row["retention"] <= 1.0, (system, row)
            assert 0.0 <= row["prefix_reuse"] <= 1.0
        for system in ("truncation", "clearing"):
            assert split[system]["tokens_max"] <= 3000 and split[system]["over_limit"] == 0
            assert split[system]["invalid"] == 0
        assert split["full"]["retention"] == split["full"]["labelled_retention"] == 1.0
        assert split["full"]["over_limit"] > 0  # the runs outgrow the window
        assert split["contextd"]["errors"] == 0 and split["contextd"]["tokens_mean"] > 0
        assert split["contextd"]["latency_p50"] > 0
    report = (out / "agent_report.md").read_text()
    assert "| 3,500 | check | 2 | 1 | 4 | t16-r0 msg 13 (tool): 413" in report
    assert "### check split, C 3,500" in report
    plotted = (out / "agent_retention_vs_limit.png").exists()
    assert plotted or "plot skipped: matplotlib missing" in report
