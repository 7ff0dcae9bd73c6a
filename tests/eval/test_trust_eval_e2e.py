"""`contextd eval trust` end to end against a real server and worker."""

import json
from pathlib import Path

from app.core.config import Settings
from app.runtime.cli import main
from tests.support.server import run_server

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py


def test_eval_trust_intercepts_orders_serves_no_stale_fact_and_leaves_nothing_revoked(
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
        assert row["injection_cases"] == 4 and row["updates"] == 3, row
        assert row["interception"] == row["flagged"] == row["data_kept"] == 1.0, row
        assert row["stale_rate"] == 0.0 and row["current"] == 1.0, row
        assert row["contradictions_keyed"] == 0.0, row
        # Every revocation kind: something derived was shown before, nothing served right
        # after, nothing left at the end, within the deadline.
        assert row["revocations"] == 5 and row["derived_before"] >= 5 * 3, row
        assert row["derived_served"] == 0 and row["derived_left"] == 0, row
        for kind in ("turn", "tool_result", "session", "user", "untrusted_source"):
            assert row[f"left_{kind}"] == 0 and row[f"seconds_{kind}"] is not None, (kind, row)
        assert row["seconds_to_zero"] is not None, row
        assert row["expiries"] == 1 and row["expiry_current_before"] == 1.0, row
        assert row["expiry_stale"] == 0.0, row
        # The order is in the window: some builds show it (as quoted data), none without the
        # constraint.
        assert row["budget_builds"] >= 5 and row["budget_order_shown"] >= 1, row
        assert row["budget_constraint_dropped"] == 0 and row["budget_stale"] == 0, row
    before = {(r["language"], r["kind"]): r["before"] for r in results["revocations"]}
    assert all(count > 0 for count in before.values()) and len(before) == 10, before
    report = (out / "trust_report.md").read_text()
    assert (
        "| interception (injected orders kept out of notes and memory) | 1.000 | 1.000 |" in report
    )
