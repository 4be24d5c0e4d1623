"""Collectives that horovod_ext's optimizers leave in flight past a step (asynchronous LSGD / EASGD rounds,
GraVAC's averaged readings), completed when the script exits, before Horovod shuts down.

A collective completes only once every rank has enqueued it. A rank that reaches the end of its script first
would otherwise shut Horovod down with its last round still pending, and a peer that has not yet enqueued the same
round gets "Horovod has been shut down" from its next collective. Every rank enqueues the same rounds at the same
steps, so waiting for them at exit completes on every rank.

Horovod's init registers its shutdown with ``atexit``; exit handlers run last registered first, so ``track``
registers ``complete_all`` again each time an optimizer is built (also after an elastic reset's init), which keeps
it ahead of Horovod's shutdown.
"""
import atexit
import weakref

from horovod.common.exceptions import HorovodInternalError

_tracked = weakref.WeakSet()


def track(owner):
    """Complete owner's collectives in flight at exit: owner.complete_in_flight() waits for them."""
    _tracked.add(owner)
    atexit.unregister(complete_all)
    atexit.register(complete_all)


def complete_all():
    """Wait for every tracked optimizer's collectives in flight (skipped where Horovod has already failed)."""
    for owner in list(_tracked):
        try:
            owner.complete_in_flight()
        except (HorovodInternalError, RuntimeError, ValueError):
            pass  # Horovod failed or was shut down under them: nothing left to complete
