"""horovod_ext/in_flight.py: what is held is completed at exit, once, then the ranks leave together when asked;
nothing is waited for after an uncaught exception. (Under horovodrun: tests/workers/async_leader_worker.py's
end_with_rounds_in_flight, tests/test_faults.py's leave_together_worker.py.)"""
import sys
import threading

import pytest

from horovod_ext import in_flight


class Owner:
    def __init__(self):
        self.completed = 0

    def complete_in_flight(self):
        self.completed += 1


def test_held_owners_complete_once_and_released_ones_not(monkeypatch):
    monkeypatch.setattr(in_flight, "_held", {})
    monkeypatch.setattr(in_flight, "_uncaught", [])
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    held, released = Owner(), Owner()
    in_flight.hold(held)
    in_flight.hold(released)
    in_flight.release(released)
    in_flight.complete_all()
    in_flight.complete_all()
    assert (held.completed, released.completed) == (1, 0)


def test_an_uncaught_exception_waits_for_nothing(monkeypatch):
    monkeypatch.setattr(in_flight, "_held", {})
    monkeypatch.setattr(in_flight, "_uncaught", [])
    monkeypatch.setattr(sys, "excepthook", lambda *args: None)
    owner = Owner()
    in_flight.hold(owner)
    assert getattr(sys.excepthook, "horovod_ext", False)
    sys.excepthook(RuntimeError, RuntimeError("a step failed"), None)
    in_flight.complete_all()
    assert owner.completed == 0


def test_leaving_together_waits_for_the_barrier_after_what_is_held(monkeypatch):
    """leave_together(barrier): at exit the held owners complete first, then the barrier over every rank runs; a
    barrier that never returns (a rank still training) is given up after EXIT_WAIT_SECONDS, with a warning."""
    order = []
    owner = Owner()
    owner.complete_in_flight = lambda: order.append("held")
    for blocks in (False, True):
        monkeypatch.setattr(in_flight, "_held", {})
        monkeypatch.setattr(in_flight, "_uncaught", [])
        monkeypatch.setattr(in_flight, "_barrier", [])
        monkeypatch.setattr(in_flight, "EXIT_WAIT_SECONDS", 0.2)
        monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
        never = threading.Event()
        in_flight.hold(owner)
        in_flight.leave_together(lambda: order.append("barrier") or (never.wait() if blocks else None))
        if blocks:
            with pytest.warns(RuntimeWarning, match="not every rank reached the end of the script"):
                in_flight.complete_all()
            never.set()
        else:
            in_flight.complete_all()
        assert order == ["held", "barrier"], order
        order.clear()


def test_leaving_together_after_an_uncaught_exception_waits_for_nothing(monkeypatch):
    monkeypatch.setattr(in_flight, "_uncaught", [])
    monkeypatch.setattr(in_flight, "_barrier", [])
    monkeypatch.setattr(sys, "excepthook", lambda *args: None)
    calls = []
    in_flight.leave_together(lambda: calls.append("barrier"))
    sys.excepthook(RuntimeError, RuntimeError("a step failed"), None)
    in_flight.complete_all()
    assert calls == []
