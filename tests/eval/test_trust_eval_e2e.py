"""`contextd eval trust` end to end against a real server and worker."""

import json
from pathlib import Path

from app.core.config import Settings
from app.runtime.cli import main
from tests.support.server import run_server

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py


def test_eval_trust_intercepts_orders_serves_no_stale_fact_and_leaves_nothing_forgotten(
    settings: Settings, admin_key: str, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    with run_server(settings, with_worker=True) as server:
        code = main(
            [
                "eval", "trust", "--url", server.url, "--api-key", admin_key, "--out", str(out),
                "--timeout", "120",
            ]
        )  # fmt: skip
    assert code == 0
    results = json.loads((out / "trust_results.json").read_text())
    for language in ("en", "zh"):
        row = results["summary"][language]
        assert row["injection_cases"] == 4 and row["updates"] == 3 and row["forgets"] == 2, row
        assert row["interception"] == row["flagged"] == row["data_kept"] == 1.0, row
        assert row["stale_rate"] == 0.0 and row["current"] == 1.0, row
        assert row["contradictions_keyed"] == 0.0, row
        assert row["derived_before"] > 0 and row["derived_left"] == 0, row
        assert row["seconds_to_zero"] is not None, row
    report = (out / "trust_report.md").read_text()
    assert (
        "| interception (injected orders kept out of notes and memory) | 1.000 | 1.000 |" in report
    )
