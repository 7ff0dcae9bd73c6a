"""Chunking a long turn costs time linear in its length (it runs inside offloads, which may run
inline in build-prompt): counted in characters tokenised, and as CPU time growth on 4x input."""

from collections.abc import Callable

import pytest

from app.domain.tokens import count_tokens
from app.domain.turn_text import turn_body
from app.offload.chunking import ChunkDraft, chunk_turns
from tests.offload.test_chunking import CFG, body_of_piece, make
from tests.support.cost import cpu_growth, tokenised_chars

PROSE = (
    "The deploy of ORD-4471 to Berlin failed twice; alice@example.com asked for a refund. "
    "Budget is at most 120 EUR, and the meeting moved to Tuesday!\n\n"
    "我们决定采用方案B，预算不超过五万。"
)

TEXTS: dict[str, Callable[[int], str]] = {
    "one letter": lambda n: "a" * n,
    "digits": lambda n: "7" * n,
    "hyphenated": lambda n: ("a-" * n)[:n],
    "prose": lambda n: (PROSE * (n // len(PROSE) + 1))[:n],
    "one sentence": lambda n: ("word " * n)[:n],
}


@pytest.mark.parametrize("kind", list(TEXTS))
@pytest.mark.parametrize("size", [16_384, 262_144])
def test_a_long_turn_is_tokenised_a_bounded_number_of_times(kind: str, size: int) -> None:
    turn = make(1, TEXTS[kind](size))
    chunks: list[ChunkDraft] = []
    chars = tokenised_chars(lambda: chunks.extend(chunk_turns([turn])))
    assert chars <= 6 * size, f"{chars / size:.1f} characters tokenised per character"
    assert "".join(body_of_piece(c) for c in chunks) == turn_body(turn)
    assert all(c.token_count == count_tokens(c.raw_text) <= CFG.max_tokens for c in chunks)


@pytest.mark.parametrize("kind", ["one letter", "hyphenated", "prose"])
def test_chunking_time_grows_linearly(kind: str) -> None:
    growth = cpu_growth(lambda n: chunk_turns([make(1, TEXTS[kind](n))]), 16_384)
    assert growth < 10, f"4x the text took {growth:.1f}x the CPU time"
