"""The delay after failed admin tokens: growing, per address, cleared by a success, bounded in memory."""

from __future__ import annotations

from proxy.throttle import BASE, CAP, FORGET, FailureThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_failure_doubles_the_wait_up_to_the_cap_and_a_success_clears_it() -> None:
    clock = Clock()
    throttle = FailureThrottle(clock=clock)
    assert throttle.wait("a") == 0
    delays = []
    for _ in range(10):
        delays.append(throttle.failed("a"))
        assert throttle.wait("a") == delays[-1] and throttle.wait("b") == 0
        clock.now += delays[-1]
        assert throttle.wait("a") == 0
    assert delays == [BASE * 2**n for n in range(7)] + [CAP] * 3
    throttle.failed("a")
    clock.now += 1
    assert throttle.wait("a") == CAP - 1
    throttle.succeeded("a")
    assert throttle.wait("a") == 0 and throttle.failed("a") == BASE


def test_an_address_quiet_for_long_starts_afresh() -> None:
    clock = Clock()
    throttle = FailureThrottle(clock=clock)
    for _ in range(5):
        clock.now += throttle.failed("a")
    clock.now += FORGET - 1
    assert throttle.failed("b") == BASE and len(throttle) == 2  # "a" is still remembered
    clock.now += throttle.failed("a")  # and its next failure waits longer again
    assert throttle.wait("a") == 0 and throttle.failed("a") == BASE * 2**6
    clock.now += FORGET + CAP
    assert throttle.failed("c") == BASE and len(throttle) == 1


def test_memory_is_bounded_by_forgetting_the_longest_ago_failure() -> None:
    throttle = FailureThrottle(clock=Clock(), max_addresses=100)
    for n in range(1000):
        throttle.failed(f"10.0.{n // 256}.{n % 256}")
    throttle.failed("10.0.3.140")  # failed again: now the newest
    assert len(throttle) == 100
    assert throttle.wait("10.0.0.0") == 0 and throttle.wait("10.0.3.231") == BASE
    assert throttle.wait("10.0.3.140") == BASE * 2
