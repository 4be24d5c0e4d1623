"""The contract of a parameter-space optimizer's backend (consensus/step.py runs LSGD's and EASGD's whole step on
it): the framework's collectives, its parameter access and its control flow. What the optimizer keeps from step
to step is state.py's ParameterState, which the step owns.
horovod_ext/torch/leader.py and horovod_ext/tensorflow/leader.py implement it.

Values are the framework's tensors; a "truth" is a Python bool or a boolean tensor (a graph); a "future" is what
``wait`` turns into the collective's result. ``host`` runs Python on host values (directly when eager, through
tf.py_function in a graph), and ``cond`` / ``when`` branch on a truth (tf.cond in TensorFlow): so one step serves
eager PyTorch, eager TensorFlow and tf.function alike. Asynchronous rounds (collectives waited for steps later)
need futures that outlive a step: ``asynchronous`` says whether the backend has them.
"""
import abc


class ParameterBackend(abc.ABC):
    nranks = rank = None
    asynchronous = False  # futures that outlive a step (Horovod's torch handles; not TensorFlow's ops)

    # ----------------------------------------------------------------------------------------------- parameters
    @abc.abstractmethod
    def parameters(self):
        """The parameters' current values, a list (read now: later writes do not change them in TensorFlow;
        PyTorch's are the parameters themselves)."""

    @abc.abstractmethod
    def add_to_parameters(self, forces):
        """x += force for each parameter (None: no change). Returns what a graph must run (an op), or None."""

    @abc.abstractmethod
    def assign_parameters(self, values):
        """x = value for each parameter (evaluation swaps)."""

    @abc.abstractmethod
    def copy(self, values):
        """Copies of a list of tensors that later writes do not change."""

    # ---------------------------------------------------------------------------------------------- collectives
    @abc.abstractmethod
    def allgather(self, x, name):
        """Start an allgather of x over every rank. Returns a future of the gathered tensor."""

    @abc.abstractmethod
    def broadcast(self, values, root, level, name):
        """Start a broadcast of `values` (a list) from the rank `level.members[root]` (root: an index, a tensor in a
        graph) within the level's process set (level None: every rank). Returns a future of the list."""

    @abc.abstractmethod
    def allreduce_mean(self, values, name):
        """Start the allreduce (Average over every rank) of `values` (a list of the current values, which later
        writes must not change). Returns a future of the list."""

    @abc.abstractmethod
    def wait(self, future):
        """The result of a future from allgather, broadcast or allreduce_mean."""

    @abc.abstractmethod
    def done(self, value):
        """A future that already holds `value` (a checkpoint's transfer)."""

    @abc.abstractmethod
    def add_process_set(self, ranks):
        """Horovod's add_process_set of this framework."""

    def level_groups(self, sync):
        """{level name: the process set or group its broadcasts run in} for a configured LeaderSync's levels with
        more than one member (collective: every rank makes every group, in the same order). Horovod's process sets
        here (agreement.level_process_sets); a backend over another library overrides it."""
        from .agreement import level_process_sets
        return level_process_sets(sync, self.nranks, self.add_process_set, self.barrier)

    @abc.abstractmethod
    def barrier(self):
        """Return once every rank has called this (a collective over every rank, eager: in_flight.py's
        leave_together calls it at exit)."""

    # ------------------------------------------------------------------------------------------ host, control
    @abc.abstractmethod
    def host(self, fn, args, dtypes):
        """fn on the host values of args (lists and numbers); returns a tuple of values of `dtypes`."""

    @abc.abstractmethod
    def cond(self, truth, true_fn, false_fn):
        """true_fn() if truth else false_fn(); both return lists of tensors of the same structure."""

    @abc.abstractmethod
    def when(self, truth, fn, otherwise=None):
        """fn() if truth (an int: nonzero), else otherwise() if given; each returns an op, a list of them, or None.
        Returns what a graph must run, or None."""

    @abc.abstractmethod
    def bit(self, mask, i):
        """A truth: bit i of an integer mask is set."""

    @abc.abstractmethod
    def after(self, first, fn):
        """fn() once `first` (an op from when / add_to_parameters, or None) has run. Returns what a graph must run."""

    @abc.abstractmethod
    def timed(self):
        """A context that adds the seconds it lasts to the statistics' comm_seconds (a null context in a graph)."""
