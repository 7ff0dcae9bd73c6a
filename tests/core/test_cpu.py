"""`batches_off_loop`: the batches an offload stores while the rest is still being chunked."""

from collections.abc import Iterator

import pytest

from app.core.cpu import INLINE_CHARS, batches_off_loop


async def collect(items: Iterator[int], size: int, chars: int) -> list[list[int]]:
    return [batch async for batch in batches_off_loop(items, size, chars=chars)]


@pytest.mark.parametrize("chars", [10, INLINE_CHARS + 1])
async def test_batches_keep_order_and_size(chars: int) -> None:
    assert await collect(iter(range(7)), 3, chars) == [[0, 1, 2], [3, 4, 5], [6]]
    assert await collect(iter([]), 3, chars) == []


@pytest.mark.parametrize("chars", [10, INLINE_CHARS + 1])
async def test_a_producer_error_reaches_the_caller_after_the_batches_before_it(chars: int) -> None:
    def items() -> Iterator[int]:
        yield from range(4)
        raise ValueError("bad turn")

    seen: list[list[int]] = []
    with pytest.raises(ValueError, match="bad turn"):
        async for batch in batches_off_loop(items(), 2, chars=chars):
            seen.append(batch)
    assert seen == [[0, 1], [2, 3]]


async def test_a_caller_that_stops_early_stops_the_producer() -> None:
    produced: list[int] = []

    def items() -> Iterator[int]:
        for i in range(1_000_000):
            produced.append(i)
            yield i

    batches = batches_off_loop(items(), 10, chars=INLINE_CHARS + 1)
    async for _ in batches:
        break
    await batches.aclose()
    assert len(produced) < 1_000_000
