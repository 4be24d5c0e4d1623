"""hvd.init for horovod_ext: Horovod's init with dynamic process sets on (unless the caller passes its own), so
that LeaderOptimizer can make its groups into process sets after init without the user building them."""


def make_init(horovod_init):
    def init(comm=None, process_sets=None):
        """horovod's ``init(comm=None, process_sets=None)``; with no process sets given, it enables Horovod's
        dynamic process sets (``process_sets="dynamic"``), which LeaderOptimizer's groups need."""
        return horovod_init(comm, process_sets="dynamic" if process_sets is None else process_sets)

    return init
