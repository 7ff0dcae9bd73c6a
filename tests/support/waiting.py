"""Wait for a condition with a deadline (never a bare sleep standing in for synchronisation)."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(
    probe: Callable[[], Awaitable[T]],
    ready: Callable[[T], bool],
    *,
    timeout: float = 60.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll `probe` until `ready(value)`; fail with the last value after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if ready(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {value!r}")
        await asyncio.sleep(interval)
