"""MADial-Bench evaluation: the pure parts, and `contextd eval madial` against a real server."""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.core.config import Settings
from app.eval.madial import (
    DialogueLine,
    DialogueResult,
    bm25_madial,
    load_madial,
    parse_line,
    ranked_units,
    recall_at,
    split_of,
    summarise_by_split,
    summarise_madial,
)
from app.runtime.cli import main
from tests.support.server import run_server

ZH_EVENTS = [
    "Bart在圣诞节晚会上跳舞，感觉非常开心。",
    "Bart养了一只叫豆豆的小狗，每天带它去公园散步。",
    "Bart考试没考好，心情很低落。",
    "Lisa第一次学会了骑自行车，非常自豪。",
    "Lisa在海边捡到了很多漂亮的贝壳。",
    "Lisa的奶奶生病住院了，她很担心。",
]
EN_EVENTS = [
    "Bart danced at the Christmas party and felt very happy.",
    "Bart has a puppy called Doudou and walks it in the park every day.",
    "Bart did badly in an exam and felt low.",
    "Lisa learned to ride a bicycle for the first time and was proud.",
    "Lisa collected many pretty seashells at the beach.",
    "Lisa's grandmother was taken to hospital and she was worried.",
]
ZH_DIALOGUES = [
    (1, ['<Bart>:"我今天又带小狗去公园散步了！"\n', '<Assistant>:"真好！"\n'], [2]),
    (1, ['<Bart>:"元旦晚会我还想跳舞，像圣诞节晚会那样。"\n'], [1]),
    (2, ['<Lisa>:"我又去海边了，想再捡一些贝壳。"\n'], [5]),
    (2, ['<Lisa>:"奶奶出院了吗？我还是有点担心奶奶。"\n'], [6]),
]
EN_DIALOGUES = [
    (1, ['<Bart>: "I took the puppy to the park for a walk again today!"\n'], [2]),
    (1, ['<Bart>: "I want to dance at the party again, like at Christmas."\n'], [1]),
    (2, ['<Lisa>: "I went to the beach again to collect more seashells."\n'], [5]),
    (2, ['<Lisa>: "Is grandmother out of hospital? I am still worried."\n'], [6]),
]


def write_data(folder: Path) -> None:
    for lang, events, dialogues in (
        ("zh", ZH_EVENTS, ZH_DIALOGUES),
        ("en", EN_EVENTS, EN_DIALOGUES),
    ):
        memories: list[dict[str, Any]] = []
        for i, event in enumerate(events, start=1):
            memory = {
                "time": "2023-12-25",
                "scene": "s",
                "emotion": "e",
                "event": event,
                "id": str(i),
            }
            if lang == "zh":
                memory["user-id"] = 1 if i <= 3 else 2
            memories.append(memory)
        rows = [
            {
                "dialogue": ["<BOD>\n", *lines, '<Assistant>:"(recalls)"\n', "<EOD>\n"],
                "test-turn": [len(lines) + 1],
                "relevant-id": relevant,
                "user-id": user,
            }
            for user, lines, relevant in dialogues
        ]
        (folder / f"madial_{lang}_memory.json").write_text(json.dumps(memories, ensure_ascii=False))
        (folder / f"madial_{lang}_dialogue.json").write_text(json.dumps(rows, ensure_ascii=False))


def test_parse_lines_and_pool_english_memories_by_the_chinese_ids(tmp_path: Path) -> None:
    assert parse_line('<Bart>:"你好！"\n') == DialogueLine("Bart", "你好！")
    assert parse_line('<Assistant>: "Sure."\n') == DialogueLine("Assistant", "Sure.")
    assert parse_line("<BOD>\n") is None and parse_line("<EOD>\n") is None
    assert (
        DialogueLine("Assistant", "x").role == "assistant"
        and DialogueLine("Bart", "x").role == "user"
    )
    write_data(tmp_path)
    memories, dialogues = load_madial(tmp_path, "en")
    assert [m.user for m in memories] == ["1", "1", "1", "2", "2", "2"]
    # Scene and emotion become the remembered item's tags (an empty label is left out).
    assert memories[0].tags == ["s", "e"]
    assert replace(memories[0], emotion="").tags == ["s"]
    assert dialogues[0].query == "Bart: I took the puppy to the park for a walk again today!"
    assert dialogues[0].relevant == ("2",) and dialogues[2].user == "2"
    # The test turn (the assistant's recalling line) is not part of the query.
    assert all("(recalls)" not in d.query for d in dialogues)


def test_recall_at_k_and_units() -> None:
    assert recall_at(["1", "2"], [["3"], ["1"], ["2"]], 2) == 0.5
    assert recall_at(["1", "2"], [["3"], ["1", "2"]], 2) == 1.0  # one item standing for two
    assert recall_at(["1"], [], 5) == 0.0
    stored = {"m-a": ["1"], "m-b": ["2", "7"]}
    units = ranked_units([{"memory_id": "m-b"}, {"chunk_id": "c"}, {"memory_id": "m-a"}], stored)
    assert units == [["2", "7"], [], ["1"]]


def test_split_by_position_and_summaries_per_split() -> None:
    assert [split_of(i) for i in range(4)] == ["tune", "check", "tune", "check"]
    results = [DialogueResult(i, "1", 1, at_k={5: float(i % 2)}) for i in range(4)]
    table = summarise_by_split(results, (5,))
    assert table["all"]["R@5"] == 0.5 and table["all"]["n"] == 4
    assert table["tune"]["R@5"] == 0.0 and table["check"]["R@5"] == 1.0
    assert table["tune"]["n"] == 2 and table["check"]["n"] == 2


def test_bm25_baseline_on_the_tiny_data(tmp_path: Path) -> None:
    write_data(tmp_path)
    for lang in ("zh", "en"):
        memories, dialogues = load_madial(tmp_path, lang)
        table = summarise_madial(bm25_madial(memories, dialogues, (1, 3)), (1, 3))
        assert table["n"] == 4 and table["R@3"] == 1.0, (lang, table)


def test_eval_madial_through_the_api(
    settings: Settings, api_key: str, tmp_path: Path, capsys: Any
) -> None:
    write_data(tmp_path)
    with run_server(settings, with_worker=True) as server:
        for lang in ("zh", "en"):
            code = main(
                [
                    "eval", "madial", "--data", str(tmp_path), "--lang", lang, "--url", server.url,
                    "--api-key", api_key, "--out", str(tmp_path / "report"), "--k", "1,3",
                    "--timeout", "120",
                ]
            )  # fmt: skip
            assert code == 0
    for lang in ("zh", "en"):
        results = json.loads((tmp_path / "report" / f"madial_{lang}_results.json").read_text())
        ours = results["summary"]["contextd"]["all"]
        assert ours["n"] == 4
        # Dialogues 0 and 2 are the tune split, 1 and 3 the check split.
        splits = results["summary"]["contextd"]
        assert splits["tune"]["n"] == 2 and splits["check"]["n"] == 2
        # Each dialogue shares words with exactly its own memory: contextd must find it.
        assert ours["R@3"] == 1.0 and ours["R@1"] >= 0.75, (lang, ours)
        report = (tmp_path / "report" / f"madial_{lang}_report.md").read_text()
        assert "| contextd (memory recall) | all | 4 |" in report
        assert "| contextd (memory recall) | tune | 2 |" in report
        assert "its `scene` and `emotion` as the item's tags" in report
        # These settings have no embedder: every recall went on lexically, and the report says so.
        assert results["lexical_only"] == 4
        assert all("vector_unavailable" in d["fallbacks"] for d in results["dialogues"])
        assert "lexical only: `vector_unavailable`):\n4 of 4." in report
    assert "| bm25 | check | 2 |" in capsys.readouterr().out
