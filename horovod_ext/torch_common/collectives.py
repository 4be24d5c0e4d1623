"""The adapters' collectives for the parameter-space optimizers (parameter_sync.py: LSGD and EASGD; diloco.py:
DiLoCo), with no Horovod import: horovod_ext/torch/collectives.py implements them over Horovod, horovod_ext/ddp/
collectives.py over torch.distributed."""
import abc


class Collectives(abc.ABC):
    """What the parameter-space optimizers ask of an adapter: this rank and the job's size (read at each use: an
    elastic reset changes them), the compression plan's backend and LSGD's/EASGD's parameter backend, the groups,
    and a few collectives outside the plan. A group is the adapter's (a Horovod process set, a torch.distributed
    group); None is every rank."""

    rank = size = None

    @abc.abstractmethod
    def backend(self, group, stats):
        """The compression plan's backend over `group`, averaging."""

    @abc.abstractmethod
    def parameter_backend(self, params, stats):
        """LSGD's and EASGD's backend (parameter_sync.TorchParameterBackend with this adapter's collectives)."""

    @abc.abstractmethod
    def group_size(self, group):
        """The ranks in `group` (None: every rank)."""

    @abc.abstractmethod
    def worker_groups(self, settings):
        """(this rank's worker's group, None if the worker is one rank; the leaders' group), made on every rank in
        the same order (collective)."""

    @abc.abstractmethod
    def numpy_allgather(self, group):
        """allgather(array, name) -> the group's NumPy arrays concatenated (consistency.allgather_blobs)."""

    @abc.abstractmethod
    def broadcast_(self, tensor, root, group, name):
        """tensor takes the value of the global rank `root`'s, within `group` (in place; returns once done)."""

    @abc.abstractmethod
    def allreduce_sum(self, tensor, name):
        """The sum of tensor over every rank (a new tensor; returns once done)."""

    @abc.abstractmethod
    def broadcast_object(self, obj, root, name):
        """The global rank `root`'s Python object, on every rank."""

    def track(self, optimizer):
        """Called once per optimizer, at construction (Horovod's hvd.join applies its exchange in flight)."""

