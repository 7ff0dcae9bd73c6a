"""The circuit breaker's states, on an injected clock."""

from app.core.breaker import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_consecutive_failures_and_lets_one_trial_through_after_the_cooldown() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=3, cooldown_seconds=30, clock=clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.failed()
    breaker.succeeded()  # a success resets the count
    for _ in range(3):
        assert breaker.allow()
        breaker.failed()
    assert not breaker.allow()
    clock.now = 29.9
    assert not breaker.allow()
    clock.now = 30.0
    assert breaker.allow()  # the trial call
    assert not breaker.allow()  # only one while it is in flight
    breaker.failed()  # the trial failed: open for another cooldown
    clock.now = 59.9
    assert not breaker.allow()
    clock.now = 60.0
    assert breaker.allow()
    breaker.succeeded()
    assert breaker.allow() and breaker.allow()


def test_an_inconclusive_call_changes_no_count_and_frees_the_trial() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=2, cooldown_seconds=30, clock=clock)
    breaker.failed()
    breaker.inconclusive()
    assert breaker.allow()  # still one failure short of opening
    breaker.failed()
    assert not breaker.allow()
    clock.now = 30.0
    assert breaker.allow()  # the trial call
    breaker.inconclusive()  # it queued behind others: no verdict
    assert breaker.allow()  # another trial may go
    assert not breaker.allow()
