"""A circuit breaker: after some consecutive failures of a dependency, skip it for a while.

Pure bookkeeping (the clock is injected), so that a hanging or failing service costs its time
budget a few times, not on every request: while the breaker is open, callers take their fallback
at once; after the cooldown one call tries the dependency again (half-open), and its outcome
closes the breaker or opens it for another cooldown.
"""

import time
from collections.abc import Callable


class CircuitBreaker:
    def __init__(
        self,
        failures: int,
        cooldown_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.cooldown_seconds = cooldown_seconds
        self._clock = clock
        self._failed = 0  # consecutive failures
        self._open_until: float | None = None
        self._probing = False  # a half-open trial call is in flight

    def allow(self) -> bool:
        """Whether to call the dependency now."""
        if self._open_until is None:
            return True
        if self._clock() < self._open_until or self._probing:
            return False
        self._probing = True  # the cooldown is over: one trial call
        return True

    def succeeded(self) -> None:
        self._failed = 0
        self._open_until = None
        self._probing = False

    def inconclusive(self) -> None:
        """A call that says nothing of the dependency's health (it queued behind calls that
        succeeded): no count changes; a half-open trial may be made again."""
        self._probing = False

    def failed(self) -> None:
        self._failed += 1
        self._probing = False
        if self._open_until is not None or self._failed >= self.failures:
            self._open_until = self._clock() + self.cooldown_seconds
