"""CPU-bound work off the event loop.

One event loop serves every request of a process (and, in a worker process, its jobs), so
tokenising or scanning a long text on it stalls everyone. Pure work on more than
`INLINE_CHARS` characters of text runs in a worker thread instead (tiktoken releases the GIL while
it encodes; Python code yields it every few milliseconds); smaller work runs inline, where a
thread hop would cost more than the work.
"""

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TypeVar

from threadpoolctl import threadpool_limits

T = TypeVar("T")

INLINE_CHARS = 16_384


def one_blas_thread() -> None:
    """numpy's BLAS computes on one thread in this process from now on. OpenBLAS runs a product
    of more than ~10,000 rows (recall's vector scan of a large session) on every core; beside the
    e5 engine and PostgreSQL its second thread waits for a core: 21,000 x 384 took 7.8 ms at p50
    against 1.2 ms on one thread. The API's other cores belong to those processes and to more API
    processes (`serve --workers`)."""
    threadpool_limits(limits=1, user_api="blas")


async def off_loop(work: Callable[[], T], *, chars: int) -> T:
    """`work()`, in a worker thread when it handles more than `INLINE_CHARS` characters."""
    if chars <= INLINE_CHARS:
        return work()
    return await asyncio.to_thread(work)


async def batches_off_loop(items: Iterable[T], size: int, *, chars: int) -> AsyncIterator[list[T]]:
    """`items` in lists of up to `size`, produced in a worker thread when they handle more than
    `INLINE_CHARS` characters: while the caller awaits I/O on one batch (a database on another
    core), the thread produces the next. An error of the producer is raised to the caller after
    the batches produced before it; a caller that stops early stops the producer."""
    if chars <= INLINE_CHARS:
        inline: list[T] = []
        for item in items:
            inline.append(item)
            if len(inline) == size:
                yield inline
                inline = []
        if inline:
            yield inline
        return
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[list[T] | None] = asyncio.Queue()
    stop = threading.Event()

    def produce() -> None:
        try:
            batch: list[T] = []
            for item in items:
                if stop.is_set():
                    return
                batch.append(item)
                if len(batch) == size:
                    loop.call_soon_threadsafe(queue.put_nowait, batch)
                    batch = []
            if batch:
                loop.call_soon_threadsafe(queue.put_nowait, batch)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    producer = asyncio.ensure_future(asyncio.to_thread(produce))
    try:
        while (batch := await queue.get()) is not None:
            yield batch
        await producer  # the producer's error, if any
    finally:
        stop.set()
        if not producer.done():
            with contextlib.suppress(Exception):
                await producer
