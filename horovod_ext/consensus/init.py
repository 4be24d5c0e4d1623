"""hvd.init for horovod_ext: Horovod's init with dynamic process sets on (unless the caller passes its own), so
that LeaderOptimizer can make its groups into process sets after init without the user building them.

It also repairs Horovod 0.28.1's process-set bookkeeping in a process that has imported both horovod.torch and
horovod.tensorflow: horovod.common.process_sets keeps one module-global "basics", the framework imported last, and
Horovod's init resolves the process sets' ranks through it before pointing it at the framework being initialized.
Initializing torch after TensorFlow was imported (or the other way round) left global_process_set.ranks == [] (the
uninitialized framework's answer), so ProcessSet.included() read False on every rank. init resolves them again
through the framework it initialized."""
from horovod_ext.compression import generation
from horovod_ext.horovod_internals import resolve_process_sets


def make_init(horovod_init, basics=None):
    def init(comm=None, process_sets=None):
        """horovod's ``init(comm=None, process_sets=None)``; with no process sets given, it enables Horovod's
        dynamic process sets (``process_sets="dynamic"``), which LeaderOptimizer's groups need."""
        result = horovod_init(comm, process_sets="dynamic" if process_sets is None else process_sets)
        if basics is None:
            return result
        given = [] if process_sets is None or isinstance(process_sets, str) else list(process_sets)
        resolve_process_sets(basics, given)
        return result

    return init


def reinitialize(shutdown, init):
    """Horovod's elastic reset (shutdown, then init), initializing as the script's first init did: dynamic process
    sets stay on where it turned them on (Horovod keeps that in HOROVOD_DYNAMIC_PROCESS_SETS), so a rank that starts
    the script afresh agrees with the survivors. init is horovod_ext's (make_init). The names of horovod_ext's
    collectives move to the next generation (compression/generation.py)."""
    shutdown()
    generation.advance()
    init(process_sets=[])
