"""`contextd eval locomo` end to end against a real server with its worker (lexical only)."""

import json
import re
from pathlib import Path
from typing import Any

from app.core.config import Settings
from app.runtime.cli import main
from tests.support.server import run_server

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py

PETS = ["parrot", "hamster", "iguana", "goldfish", "tortoise", "ferret", "rabbit", "gecko"]
PETS += ["canary", "axolotl", "chinchilla", "hedgehog", "lizard", "pony", "alpaca", "beagle"]
CITIES = ["Lisbon", "Oslo", "Kyoto", "Lima", "Cairo", "Quito", "Hanoi", "Perth"]
CITIES += ["Dakar", "Riga", "Tunis", "Bogota", "Osaka", "Accra", "Minsk", "Nairobi"]
HOBBIES = ["violin", "pottery", "archery", "chess", "fencing", "origami", "rowing", "tango"]
HOBBIES += ["karate", "knitting", "surfing", "juggling", "baking", "climbing", "poetry", "sailing"]


def synthetic_conversation(n: int) -> dict[str, Any]:
    """Four sessions of sixteen distinct facts (each stated once) with filler between them, and
    questions about them."""
    conv: dict[str, Any] = {"speaker_a": "Ann", "speaker_b": "Bob"}
    qa = []
    for s in range(1, 5):
        conv[f"session_{s}_date_time"] = f"1:56 pm on {s} May, 2023"
        turns = []
        for t in range(1, 21):
            i = (s * 4 + t // 5 + n) % len(PETS)
            if t % 5 == 1:
                text = f"My cousin in {CITIES[i]} keeps a {PETS[i]} and plays {HOBBIES[i]}."
            else:
                text = f"Sure, that sounds fine to me, talk soon about the weekend plans {t}."
            turn = {"speaker": "Ann" if t % 2 else "Bob", "dia_id": f"D{s}:{t}", "text": text}
            if t == 3:
                turn["blip_caption"] = "a photo of a sunny beach"
            turns.append(turn)
            if t % 5 == 1:
                qa.append(
                    {
                        "question": f"What pet does the cousin in {CITIES[i]} keep?",
                        "answer": PETS[i],
                        "evidence": [f"D{s}:{t}"] if t != 6 else [f"D:{s}:0{t}"],
                        "category": 1 + (t // 5) % 4,
                    }
                )
        conv[f"session_{s}"] = turns
    qa.append({"question": "Broken", "answer": "-", "evidence": ["D"], "category": 5})
    return {"sample_id": f"syn-{n}", "conversation": conv, "qa": qa}


def test_eval_locomo_writes_a_report(
    settings: Settings, api_key: str, tmp_path: Path, capsys: Any
) -> None:
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps([synthetic_conversation(0), synthetic_conversation(3)]))
    out = tmp_path / "report"
    with run_server(settings, with_worker=True) as server:
        code = main(
            [
                "eval", "locomo", "--data", str(data), "--url", server.url,
                "--api-key", api_key, "--out", str(out), "--conversations", "2",
                "--budgets", "150,300", "--k", "1,5", "--context-limit", "1500",
                "--reserve-tokens", "200", "--min-recent-tokens", "100",
                "--no-wait-embedded", "--timeout", "120", "--memory-tool",
            ]
        )  # fmt: skip
    assert code == 0
    report = (out / "locomo_report.md").read_text()
    assert "## Overall (categories 1-4)" in report and "bm25 single turns" in report
    printed = capsys.readouterr()
    assert "| contextd |" in printed.out
    assert "questions asked: 32/32 (100%)" in printed.err  # progress on stderr
    assert re.search(r"turns appended: (\d+)/\1 \(100%\)", printed.err)

    results = json.loads((out / "locomo_results.json").read_text())
    sessions = results["sessions"]
    assert len(sessions) == 2 and all(s["chunks"] > 0 for s in sessions)
    for method in ("contextd", "bm25", "bm25_framed"):
        overall = results["summary"][method]["overall"]
        assert overall["n"] == 32
        for key in ("B150", "B300"):
            assert 0.0 <= overall[key] <= 1.0, (method, key, overall)
    ours, bm25 = results["summary"]["contextd"]["overall"], results["summary"]["bm25"]["overall"]
    assert 0.0 <= ours["R@1"] <= ours["R@5"] <= 1.0
    assert 0.0 <= bm25["R@1"] <= bm25["R@5"] <= 1.0
    assert bm25["R@5"] > 0.9  # every fact is stated once, in words no other turn uses
    # contextd's own recall has a floor: an empty or misranked recall fails here.
    assert ours["R@5"] >= 0.9, ours
    assert ours["B300"] >= 0.9 and ours["B300_recalled"] >= 0.85, ours
    assert ours["tokens300"] <= 300
    # The memory tool's recall of the same questions at the same budgets, side by side.
    tool = results["summary"]["memory_tool"]["overall"]
    assert tool["n"] == 32 and tool["B300"] >= 0.9 and tool["B300_recalled"] >= 0.85, tool
    assert "| contextd memory tool |" in report and "B300 memory tool" in report
    assert len(results["memory_tool_questions"]) == len(results["questions"])
    # Every contextd row is a real measurement: no failed builds in this run.
    assert not re.search(r"\*\*server error\*\*[^|]*\| [1-9]", report)
