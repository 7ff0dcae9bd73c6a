"""Progress of a long command (`contextd eval …`, `contextd reembed`) on stderr, so a person sees
it move while stdout keeps only the results a script reads."""

import sys
import time
from collections.abc import Callable


def say(message: str) -> None:
    """One line of what a long command is doing, on stderr."""
    print(message, file=sys.stderr, flush=True)


class Progress:
    """`what: done/total (percent), elapsed, about N s left`, at most once per `every_s` and
    always at the last item, written with `write` (stderr by default)."""

    def __init__(
        self,
        what: str,
        total: int,
        *,
        every_s: float = 2.0,
        write: Callable[[str], None] = say,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.total, self.done = what, total, 0
        self._every_s, self._write, self._clock = every_s, write, clock
        self._started = self._last = clock()

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = self._clock()
        if self.done < self.total and now - self._last < self._every_s:
            return
        self._last = now
        self._write(self.line(now))

    def line(self, now: float) -> str:
        elapsed = now - self._started
        share = self.done / self.total if self.total else 1.0
        left = elapsed / share - elapsed if 0 < share < 1 else 0.0
        tail = f", about {left:.0f} s left" if self.done < self.total else ""
        return f"{self.what}: {self.done}/{self.total} ({share:.0%}), {elapsed:.0f} s{tail}"
