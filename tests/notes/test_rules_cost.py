"""The rules generator's work grows linearly with a turn's length, whatever the text is made of:
a long run of one character must not make a pattern retry from every position (quadratic).
Measured as the growth of CPU time from a 16 KB to a 64 KB turn (linear: ~4x; quadratic: ~16x),
the best of three runs each, so a busy machine does not decide it."""

import time
from datetime import UTC, datetime

import pytest

from app.domain.records import TurnRecord
from app.notes.rules import extract

SHAPES = {
    "digits": "1",
    "letters": "a",
    "digit groups": "1,2",
    "dotted": "a.b-c",
    "capitals": "A",
    "code-like": "aB3-",
    "address-like": "a@",
    "chinese": "我女儿对花生过敏",
    "sentences": "I must not. ",
}


def cpu_seconds(text: str) -> float:
    turn = TurnRecord(1, "user", text, 10, datetime(2024, 1, 1, tzinfo=UTC))
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        extract([turn])
        best = min(best, time.process_time() - started)
    return max(best, 1e-4)


@pytest.mark.parametrize("unit", SHAPES.values(), ids=SHAPES.keys())
def test_extraction_work_grows_linearly_with_the_turn(unit: str) -> None:
    small, large = ((unit * (n // len(unit) + 1))[:n] for n in (16_000, 64_000))
    assert cpu_seconds(large) / cpu_seconds(small) < 8
