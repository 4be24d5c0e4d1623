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
``complete_all`` again (also after an elastic reset's init), which keeps it ahead of Horovod's shutdown. A script that
ends with an uncaught exception waits for nothing: its peers may never enqueue what it left in flight, and Horovod's
shutdown is what tells them it has gone.

Leaving together (``leave_together``). In data-parallel training every step ends in a collective over all ranks,
so no rank can leave while another still has one in flight. A group's collectives (a DiLoCo worker's inner
allreduce and its leader's broadcast, LSGD's levels: Horovod process sets) involve its own ranks only, so one group
can end its script and shut Horovod down, which shuts it down on every rank, while another group's last collective
is still in flight. Once a rank uses a process set other than the global one, the same exit handler therefore
also waits, after the collectives above, in a barrier over every rank, for at most ``EXIT_WAIT_SECONDS``: a rank
that ends while others still train (uneven data without ``hvd.join()``) lets them fail as plain Horovod would,
that much later, rather than hang. After an uncaught exception it waits for nothing, as above; a ``sys.exit()``
is no exception here and waits (at most the bound).
"""
import atexit
import sys
import threading
import warnings

_held = {}  # id -> owner with collectives in flight
_uncaught = []  # an exception ended the script (sys.excepthook saw it)
_barrier = []  # [a collective over every rank]: the ranks leave together
EXIT_WAIT_SECONDS = 120.0


def _noting(hook):
    def excepthook(kind, value, traceback):
        _uncaught.append(kind)
        hook(kind, value, traceback)

    excepthook.horovod_ext = True
    return excepthook


def hold(owner):
    """owner has collectives in flight past its step: at exit, owner.complete_in_flight() waits for them."""
    _held[id(owner)] = owner
    _ahead_of_horovods_shutdown()


def leave_together(barrier):
    """At exit every rank waits in ``barrier()`` (a collective over every rank of this framework's Horovod,
    eager), at most EXIT_WAIT_SECONDS, before Horovod's shutdown. Called on every rank that makes a process set
    other than the global one (consensus/agreement.py's process_set_for)."""
    _barrier[:] = [barrier]
    _ahead_of_horovods_shutdown()


def _ahead_of_horovods_shutdown():
    """Register complete_all again, after the latest Horovod init's shutdown hook, and note uncaught exceptions."""
    if not getattr(sys.excepthook, "horovod_ext", False):
        sys.excepthook = _noting(sys.excepthook)
    atexit.unregister(complete_all)
    atexit.register(complete_all)


def complete_all():
    """Wait for every tracked optimizer's collectives in flight, then (leave_together) for every rank, unless an
    exception ended the script (skipped where Horovod has already failed under them)."""
    if _uncaught:
        return
    for owner in list(_held.values()):
        try:
            owner.complete_in_flight()
        except (RuntimeError, ValueError):  # HorovodInternalError is a RuntimeError
            pass  # Horovod failed or was shut down under them: nothing left to complete
    _held.clear()
    if _barrier:
        _wait_for_every_rank(_barrier[0])


def _wait_for_every_rank(barrier):
    """barrier() in a daemon thread, waited for at most EXIT_WAIT_SECONDS (Horovod's shutdown then fails it)."""
    def run():
        try:
            barrier()
        except Exception:  # noqa: BLE001 (Horovod is shut down already: another rank failed, nothing to wait for)
            pass

    thread = threading.Thread(target=run, name="horovod_ext.leave_together", daemon=True)
    thread.start()
    thread.join(EXIT_WAIT_SECONDS)
    if thread.is_alive():
        warnings.warn(f"horovod_ext: not every rank reached the end of the script within {EXIT_WAIT_SECONDS:.0f} s "
                      f"of this one; shutting Horovod down (the ranks still training fail)", RuntimeWarning,
                      stacklevel=1)


def release(owner):
    """owner has taken in (or dropped) everything it had in flight."""
    _held.pop(id(owner), None)
