"""`contextd eval notes` end to end against a real server and worker, rules and LLM generators."""

import json
from pathlib import Path
from typing import Any

import pytest

from app.core.config import Settings
from app.runtime.cli import main
from tests.eval.notes_suite import generate_suite
from tests.eval.test_locomo_e2e import PETS, synthetic_conversation
from tests.support.fake_notes_model import reply
from tests.support.loopback import loopback_server
from tests.support.server import run_server

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py


def locomo_with_observations(n: int) -> dict[str, Any]:
    """The synthetic LoCoMo sample, one observation per turn; every fifth turn of each session is
    Ann (speaker A, the user) stating an allergy, which the notes keep."""
    sample = synthetic_conversation(n)
    observations: dict[str, Any] = {}
    for key, turns in sample["conversation"].items():
        if not key.startswith("session_") or key.endswith("date_time"):
            continue
        per_speaker: dict[str, list[list[str]]] = {}
        for t in turns:
            if t["dia_id"].endswith(":5"):
                t["text"] = f"I'm allergic to {PETS[int(t['dia_id'][1]) % len(PETS)]} hair."
            text = (
                t["text"].replace("My cousin", f"{t['speaker']}'s cousin").replace("I'm", "Ann is")
            )
            per_speaker.setdefault(t["speaker"], []).append([text, t["dia_id"]])
        observations[f"{key}_observation"] = per_speaker
    sample["observation"] = observations
    return sample


def run_eval(url: str, key: str, tmp_path: Path, out: Path) -> dict[str, Any]:
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(generate_suite(1), ensure_ascii=False))
    locomo = tmp_path / "locomo.json"
    locomo.write_text(json.dumps([locomo_with_observations(0)]))
    code = main(
        [
            "eval", "notes", "--suite", str(suite), "--locomo", str(locomo), "--url", url,
            "--api-key", key, "--out", str(out), "--timeout", "240",
        ]
    )  # fmt: skip
    assert code == 0
    return dict(json.loads((out / "notes_results.json").read_text()))


def assert_acceptance(results: dict[str, Any]) -> None:
    for group in ("dev/en", "dev/zh"):
        row = results["suite"][group]
        assert row["conversations"] == 1 and row["must_keep"] >= 12 and row["in_window"] == 0
        assert row["recall"] >= 0.9, (group, row)
        assert row["precision"] >= 0.95, (group, row)
        assert row["decisions_changed"] >= 1 and row["decisions_latest_only"] == 1.0, row
    assert set(results["suite"]) == {"dev/en", "dev/zh", "heldout/en", "heldout/zh"}
    observed = results["observations"]
    assert observed["all"]["n"] == 80 and observed["user"]["n"] == 40
    # The four allergies (user turns) are kept with their turns; assistant turns give no facts.
    assert observed["user"]["key_terms"] == observed["user"]["source_cited"] == 4 / 40
    assert observed["assistant"]["key_terms"] == observed["assistant"]["source_cited"] == 0.0


def test_eval_notes_rules_generator_writes_the_report(
    settings: Settings, admin_key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    with run_server(settings, with_worker=True) as server:
        results = run_eval(server.url, admin_key, tmp_path, out)
    assert results["generators"] == ["rules"]
    assert_acceptance(results)
    report = (out / "notes_report.md").read_text()
    assert "## Scripted suite" in report and "| held-out | zh |" in report
    assert "## LoCoMo observations (reference, no target)" in report
    assert "| dev | en | 1 |" in capsys.readouterr().out


def test_eval_notes_llm_generator_against_a_loopback_model(
    settings: Settings, admin_key: str, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    with loopback_server(reply) as model:
        llm = settings.model_copy(
            update={
                "notes": settings.notes.model_copy(
                    update={"generator": "llm", "llm_base_url": model.url}
                )
            }
        )
        with run_server(llm, with_worker=True) as server:
            results = run_eval(server.url, admin_key, tmp_path, out)
    assert results["generators"] == ["llm"]
    assert_acceptance(results)
    requests = [body for method, path, body in model.requests if path == "/v1/chat/completions"]
    assert requests and all(r["response_format"] == {"type": "json_object"} for r in requests)
    assert any("[seq 1 | user]" in r["messages"][-1]["content"] for r in requests)
