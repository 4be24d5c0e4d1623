"""Every rank leaves together once process sets are in use (framework-free).

Horovod shuts down on every rank as soon as one rank shuts down (``hvd.shutdown``, which Horovod's own ``atexit``
hook calls after the script's last line): a collective still in flight elsewhere then fails with "Horovod has been
shut down". In data-parallel training that cannot happen at the end of a script, as every step ends in a collective
over all ranks. A group's collectives (a DiLoCo worker's inner allreduce and its leader's broadcast, LSGD's levels)
involve its own ranks only, so one group can finish its last step and shut Horovod down while another group's last
collective is still in flight.

Once a rank has a process set other than the global one, it therefore waits at exit, before Horovod's shutdown, in
a barrier over every rank (``leave_together(barrier)`` registers it, again after each Horovod init, so it runs
before the latest shutdown hook: ``atexit`` runs last-registered first). The wait is bounded by
``EXIT_WAIT_SECONDS``: a rank that leaves while others still train (uneven data without ``hvd.join()``) lets them
fail as plain Horovod would, that much later, rather than hang. A rank leaving by an uncaught exception does not wait:
its shutdown fails the others at once, as in Horovod.
"""
import atexit
import sys
import threading
import warnings

EXIT_WAIT_SECONDS = 120.0
_barrier = [None]


def leave_together(barrier):
    """At interpreter exit, before Horovod's shutdown, wait (at most EXIT_WAIT_SECONDS) in ``barrier()``, a
    collective over every rank of this framework's Horovod. Call on every rank (process sets are made on all)."""
    _barrier[0] = barrier
    atexit.unregister(_wait_for_every_rank)
    atexit.register(_wait_for_every_rank)


def _leaving_by_exception():
    """The interpreter reports an uncaught exception (sys.last_value / sys.last_exc are set when it is printed)."""
    return getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None


def _quietly(barrier, failed):
    try:
        barrier()
    except Exception as exc:  # Horovod shut down already (another rank failed): nothing left to wait for
        failed.append(exc)


def _wait_for_every_rank(timeout=None):
    barrier = _barrier[0]
    if barrier is None or _leaving_by_exception():
        return
    failed = []
    thread = threading.Thread(target=_quietly, args=(barrier, failed), name="horovod_ext.leave_together",
                              daemon=True)
    thread.start()
    thread.join(EXIT_WAIT_SECONDS if timeout is None else timeout)
    if thread.is_alive():
        warnings.warn(f"horovod_ext: not every rank reached the end of the script within {EXIT_WAIT_SECONDS:.0f} s "
                      f"of this one; shutting Horovod down (the ranks still training fail)", RuntimeWarning,
                      stacklevel=1)
