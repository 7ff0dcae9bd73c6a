"""CPU-bound work off the event loop.

One event loop serves every request of a process (and, under `contextd dev`, the worker's jobs
too), so tokenising or scanning a long text on it stalls everyone. Pure work on more than
`INLINE_CHARS` characters of text runs in a worker thread instead (tiktoken releases the GIL while
it encodes; Python code yields it every few milliseconds); smaller work runs inline, where a
thread hop would cost more than the work.
"""

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

INLINE_CHARS = 16_384


async def off_loop(work: Callable[[], T], *, chars: int) -> T:
    """`work()`, in a worker thread when it handles more than `INLINE_CHARS` characters."""
    if chars <= INLINE_CHARS:
        return work()
    return await asyncio.to_thread(work)
