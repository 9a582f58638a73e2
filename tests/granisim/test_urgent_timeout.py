"""Arrivals are delivered with UrgentTimeout: at equal times they come before any NORMAL event, such as a step's
end, whatever the order the two were scheduled in."""
import simpy

from granisim.core.serving_loop import UrgentTimeout


def _order(urgent_first: bool) -> list[str]:
    env, seen = simpy.Environment(), []

    def wait(name, make):
        value = yield make()
        seen.append((name, value))

    step = lambda: env.timeout(1.5, value="step")  # noqa: E731
    arrival = lambda: UrgentTimeout(env, 1.5, value="arrival")  # noqa: E731
    makers = [("arrival", arrival), ("step", step)]
    for name, make in (makers if urgent_first else makers[::-1]):
        env.process(wait(name, make))
    env.run()
    assert env.now == 1.5
    return seen


def test_urgent_timeout_comes_before_a_normal_timeout_of_the_same_time():
    for urgent_first in (True, False):
        assert _order(urgent_first) == [("arrival", "arrival"), ("step", "step")]


def test_urgent_timeout_keeps_time_order_across_times():
    env, seen = simpy.Environment(), []

    def wait(delay):
        yield UrgentTimeout(env, delay)
        seen.append(env.now)

    for d in (3.0, 0.0, 2.0):
        env.process(wait(d))
    env.run()
    assert seen == [0.0, 2.0, 3.0]
