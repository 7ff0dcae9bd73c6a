"""Bounds on work that do not depend on how fast or busy the machine is.

- `tokenised_chars`: characters handed to the tokenizer while a function runs (observed with a
  profile hook on tiktoken's `Encoding.encode`, nothing is replaced): a count, so exact.
- `cpu_growth`: how the CPU time of a function grows when its input grows 4x (best of a few
  runs, process CPU time, so other processes on the machine hardly matter). Linear work grows
  ~4x, quadratic ~16x; callers assert a bound in between.
"""

import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from tiktoken.core import Encoding

GROWTH_FACTOR = 4
RUNS = 5


def tokenised_chars(run: Callable[[], Any]) -> int:
    total = 0
    target = Encoding.encode.__code__

    def hook(frame: FrameType, event: str, _: Any) -> None:
        nonlocal total
        if event == "call" and frame.f_code is target:
            total += len(frame.f_locals["text"])

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(previous)
    return total


def _cpu_seconds(run: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(RUNS):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


def cpu_growth(run: Callable[[int], Any], size: int) -> float:
    """CPU time of `run(GROWTH_FACTOR * size)` over that of `run(size)`."""
    small = _cpu_seconds(lambda: run(size))
    large = _cpu_seconds(lambda: run(GROWTH_FACTOR * size))
    return large / max(small, 1e-4)
