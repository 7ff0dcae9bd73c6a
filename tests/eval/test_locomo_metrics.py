"""Pure parts of the LoCoMo evaluation: evidence ids, dia_id mapping, metrics, baselines."""

from typing import Any

import pytest

from app.domain.tokens import count_tokens
from app.eval.locomo import (
    QuestionResult,
    bm25_baseline,
    coverage,
    dia_ids_of_range,
    fill_budget,
    normalise_evidence,
    parse_conversation,
    percentile,
    recall_at_k,
    summarise,
    truncation_baseline,
)

KNOWN = [f"D{s}:{t}" for s in (1, 8, 9, 11, 30) for t in range(1, 30)]


@pytest.mark.parametrize(
    ("raw", "ids", "dropped"),
    [
        (["D8:6; D9:17"], ["D8:6", "D9:17"], []),
        (["D:11:26"], ["D11:26"], []),
        (["D30:05"], ["D30:5"], []),
        (["D1:1 D1:2", "D1:2"], ["D1:1", "D1:2"], []),
        (["D1:3,D1:4"], ["D1:3", "D1:4"], []),
        (["D"], [], ["D"]),
        (["D10:19", "D1:5"], ["D1:5"], ["D10:19"]),  # session 10 does not exist
        (["D1:99"], [], ["D1:99"]),  # turn does not exist
    ],
)
def test_normalise_evidence(raw: list[str], ids: list[str], dropped: list[str]) -> None:
    assert normalise_evidence(raw, KNOWN) == (ids, dropped)


def sample() -> dict[str, Any]:
    """Two sessions given out of order (session_10 sorts before session_2 as text), an extra date
    key without a session, an image turn, and evidence in several malformed shapes."""

    def turn(dia: str, speaker: str, text: str, **extra: str) -> dict[str, str]:
        return {"dia_id": dia, "speaker": speaker, "text": text, **extra}

    return {
        "sample_id": "syn-1",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bob",
            "session_10_date_time": "9:00 am on 3 May, 2023",
            "session_10": [
                turn("D10:1", "Ann", "I adopted a parrot called Kiwi."),
                turn("D10:2", "Bob", "Lovely bird!", blip_caption="a green parrot on a perch"),
            ],
            "session_2_date_time": "1:56 pm on 1 May, 2023",
            "session_2": [
                turn("D2:1", "Ann", "My sister lives in Lisbon and teaches violin."),
                turn("D2:2", "Bob", "I ran a marathon in Berlin last autumn."),
                turn("D2:3", "Ann", "Nice. The weather was rainy today."),
            ],
            "session_11_date_time": "10:00 am on 9 May, 2023",
        },
        "qa": [
            {
                "question": "Where does Ann's sister live?",
                "answer": "Lisbon",
                "evidence": ["D2:1"],
                "category": 4,
            },
            {
                "question": "What is the parrot called and where was the marathon?",
                "answer": "x",
                "evidence": ["D10:1; D2:2"],
                "category": 1,
            },
            {
                "question": "Which city had the marathon?",
                "answer": "Berlin",
                "evidence": ["D:2:02"],
                "category": 2,
            },
            {
                "question": "What colour is the parrot?",
                "answer": "green",
                "evidence": ["D10:2"],
                "category": 5,
            },
            {"question": "Broken", "answer": "-", "evidence": ["D", "D7:1"], "category": 3},
        ],
    }


def test_parse_orders_sessions_numerically_and_renders_images() -> None:
    conv = parse_conversation(sample())
    assert [t.dia_id for t in conv.turns] == ["D2:1", "D2:2", "D2:3", "D10:1", "D10:2"]
    assert conv.turns[4].content == "Bob: Lovely bird! [image: a green parrot on a perch]"
    assert conv.turns[0].content == "Ann: My sister lives in Lisbon and teaches violin."
    assert conv.turns[3].date == "9:00 am on 3 May, 2023"
    evidence = [q.evidence for q in conv.questions]
    assert evidence == [("D2:1",), ("D10:1", "D2:2"), ("D2:2",), ("D10:2",), ()]
    assert conv.questions[4].dropped == ("D", "D7:1")


def test_dia_mapping_and_metrics() -> None:
    seq_to_dia = {11: "D2:1", 12: "D2:2", 13: "D2:3", 14: "D10:1"}
    assert dia_ids_of_range(12, 15, seq_to_dia) == {"D2:2", "D2:3", "D10:1"}
    assert dia_ids_of_range(1, 10, seq_to_dia) == set()
    assert coverage(["D2:1", "D2:2"], {"D2:2", "D9:9"}) == 0.5
    assert coverage([], {"D2:2"}) == 0.0
    ranked = [{"D2:3"}, {"D2:1", "D2:2"}, {"D10:1"}]
    assert recall_at_k(["D2:1", "D10:1"], ranked, 1) == 0.0
    assert recall_at_k(["D2:1", "D10:1"], ranked, 2) == 0.5
    assert recall_at_k(["D2:1", "D10:1"], ranked, 10) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert fill_budget([2, 0, 1], [30, 5, 10], 16) == [2, 1]  # 0 does not fit, 1 still does


def test_bm25_and_truncation_baselines_on_a_tiny_conversation() -> None:
    conv = parse_conversation(sample())
    costs = [count_tokens(t.content) for t in conv.turns]
    budget = costs[0]  # exactly one turn of that size
    results = bm25_baseline(conv, [budget, 10_000], [1, 5])
    assert len(results) == 4  # the question without evidence is skipped
    sister, multi, marathon, _parrot = results
    assert sister.at_k[1] == 1.0 and sister.budget_recall[budget] == 1.0
    assert sister.injected[budget] <= budget
    assert multi.at_k[5] == 1.0 and marathon.at_k[1] == 1.0
    assert all(0.0 <= v <= 1.0 for r in results for v in r.budget_recall.values())

    truncated = truncation_baseline(conv, count_tokens(conv.turns[-1].content) + 10)
    assert [r.in_window for r in truncated] == [0.0, 0.0, 0.0, 1.0]  # only D10:2 fits

    table = summarise(results, [budget], [1, 5])
    assert table["overall"]["n"] == 3  # categories 1-4 only
    assert table["adversarial"]["n"] == 1
    assert table["overall"]["R@5"] == 1.0


def test_summarise_means_per_category() -> None:
    rows = [
        QuestionResult("s", 4, 1, budget_recall={500: 1.0}, at_k={5: 1.0}),
        QuestionResult("s", 4, 2, budget_recall={500: 0.5}, at_k={5: 0.0}),
        QuestionResult("s", 1, 2, budget_recall={500: 0.0}, at_k={5: 0.5}),
    ]
    table = summarise(rows, [500], [5])
    assert table["single-hop"]["B500"] == 0.75
    assert table["overall"]["B500"] == pytest.approx(0.5)
    assert table["multi-hop"]["R@5"] == 0.5
