"""Collectives that horovod_ext's optimizers leave in flight past a step (asynchronous LSGD / EASGD rounds,
GraVAC's averaged readings), completed when the script exits, before Horovod shuts down.

A collective completes only once every rank has enqueued it. A rank that reaches the end of its script first
would otherwise shut Horovod down with its last round still pending, and a peer that has not yet enqueued the same
round gets "Horovod has been shut down" from its next collective. Every rank enqueues the same rounds at the same
steps, so waiting for them at exit completes on every rank.

An owner (an asynchronous step, GraVAC's method) is held here, by a strong reference, from the moment it starts a
collective that outlives its step until it has taken it in (``hold`` / ``release``): an optimizer made inside the
script's main() is gone by the time exit handlers run, and what it left in flight must still complete. Horovod's
init registers its shutdown with ``atexit``; exit handlers run last registered first, so ``hold`` registers
``complete_all`` again (also after an elastic reset's init), which keeps it ahead of Horovod's shutdown. A script that ends with an uncaught exception waits for nothing: its peers may
never enqueue what it left in flight, and Horovod's shutdown is what tells them it has gone.
"""
import atexit
import sys

from horovod.common.exceptions import HorovodInternalError

_held = {}  # id -> owner with collectives in flight
_uncaught = []  # an exception ended the script (sys.excepthook saw it)


def _noting(hook):
    def excepthook(kind, value, traceback):
        _uncaught.append(kind)
        hook(kind, value, traceback)

    excepthook.horovod_ext = True
    return excepthook


def hold(owner):
    """owner has collectives in flight past its step: at exit, owner.complete_in_flight() waits for them."""
    _held[id(owner)] = owner
    if not getattr(sys.excepthook, "horovod_ext", False):
        sys.excepthook = _noting(sys.excepthook)
    atexit.unregister(complete_all)
    atexit.register(complete_all)


def complete_all():
    """Wait for every tracked optimizer's collectives in flight, unless an exception ended the script (skipped
    where Horovod has already failed under them)."""
    if _uncaught:
        return
    for owner in list(_held.values()):
        try:
            owner.complete_in_flight()
        except (HorovodInternalError, RuntimeError, ValueError):
            pass  # Horovod failed or was shut down under them: nothing left to complete
    _held.clear()


def release(owner):
    """owner has taken in (or dropped) everything it had in flight."""
    _held.pop(id(owner), None)
