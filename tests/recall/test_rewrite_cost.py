"""The query rewrite runs on every recall; its time grows linearly with the query and with the
recent turns it reads (a 100,000-character query once blocked the service for 9.7 s)."""

from collections.abc import Callable

import pytest

from app.recall.rewrite import rewrite_query
from tests.support.cost import cpu_growth

TEXTS: dict[str, Callable[[int], str]] = {
    "one letter": lambda n: "a" * n,
    "digits": lambda n: "1" * n,
    "dotted digits": lambda n: ("1." * n)[:n],
    "local parts": lambda n: ("a@" * n)[:n],
    "ids": lambda n: ("a1 " * n)[:n],
    "prose": lambda n: ("Ask Dana about order 12345 at dana@example.com, ok? " * n)[:n],
}


@pytest.mark.parametrize("kind", list(TEXTS))
def test_a_long_query_is_rewritten_in_linear_time(kind: str) -> None:
    growth = cpu_growth(lambda n: rewrite_query(TEXTS[kind](n), ["order 12345", "ok"]), 25_000)
    assert growth < 10, f"4x the query took {growth:.1f}x the CPU time"


@pytest.mark.parametrize("kind", ["one letter", "digits", "ids"])
def test_long_recent_turns_are_read_in_linear_time(kind: str) -> None:
    growth = cpu_growth(lambda n: rewrite_query("and that one?", [TEXTS[kind](n)]), 25_000)
    assert growth < 10, f"4x the recent turn took {growth:.1f}x the CPU time"


def test_a_long_query_keeps_its_keys() -> None:
    query = "x" * 100_000 + " order 98765 and bob@example.com"
    rewritten = rewrite_query(query, [])
    assert rewritten.ids == ["98765", "bob@example.com"]
    assert rewritten.rewritten == query
