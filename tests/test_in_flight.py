"""horovod_ext/in_flight.py: what is held is completed at exit, once; nothing is waited for after an uncaught
exception. (Under horovodrun: tests/workers/async_leader_worker.py's end_with_rounds_in_flight.)"""
import sys

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
