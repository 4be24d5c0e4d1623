"""The reset generation: collective names that change at every elastic reset (framework-free).

Horovod 0.28.1 checks that it is not shutting down before it adds a collective to its tensor queue, and takes the
queue's lock only for the add (operations.cc, EnqueueTensorAllreduces and the others; tensor_queue.cc). A collective
enqueued while the background thread finalizes after a peer's death is added after the queue was emptied: it never
completes, and the global process set's queue keeps it through shutdown() and init() (process_set.cc). Its name is
then taken in that process for good: enqueueing the name again raises Horovod's duplicate-name ValueError, which
Horovod's elastic loop does not catch, so the worker exits.

So every name horovod_ext gives a collective carries the generation g, the number of elastic resets the job has been
through, once it is above 0:

    name_g = "g{g}." + name          (g > 0; at g = 0 the names are what they were)

g is agreed at the settings exchange that follows each reset (the one exchange every optimizer makes at start and
after a reset): every rank proposes the generation it knows (a rank added by the reset knows 0), and every rank takes
the largest proposal, so a survivor never reuses a name it may hold stale. A duplicate name that is nevertheless met
under elastic mode (a name outside the generation: the exchange's own) is raised as HorovodInternalError, which
rolls the job back and resets it once more, rather than ending the worker.
"""
import contextlib
import os


ELASTIC = os.environ.get("HOROVOD_ELASTIC") == "1"
# Horovod's DUPLICATE_NAME_ERROR (common/common.h)
DUPLICATE_NAME = "same name as another tensor that is currently being processed"

_known = 0  # the largest generation this process has been through or agreed to


def advance():
    """An elastic reset happened in this process (horovod_ext.consensus.init.reinitialize)."""
    global _known
    _known += 1


def proposal():
    """This process's proposal for the next agreement."""
    return _known


def agreed(proposals):
    """The generation every rank takes: the largest of the ranks' proposals (a sequence of ints, one per rank)."""
    global _known
    generation = max(int(p) for p in proposals)
    _known = max(_known, generation)
    return generation


def named(name, generation):
    """`name` in generation `generation`."""
    return name if not generation else f"g{generation}.{name}"


def is_stale_name(exc):
    return isinstance(exc, ValueError) and DUPLICATE_NAME in str(exc)


@contextlib.contextmanager
def stale_names_reset():
    """Under Horovod's elastic mode, Horovod's duplicate-name ValueError raised as HorovodInternalError (the elastic
    loop resets, and the next generation's names are new); outside it, unchanged (two tensors of one name in flight
    is the caller's error)."""
    try:
        yield
    except ValueError as exc:
        if ELASTIC and is_stale_name(exc):
            from horovod.common.exceptions import HorovodInternalError  # only Horovod's collectives get here
            raise HorovodInternalError(f"{exc} (a collective of this name was left in Horovod's queue by the last "
                                       f"failure; horovod_ext resets with new names)") from exc
        raise
