"""The parameter-space optimizers' collectives over Horovod (torch_common/collectives.py's contract): process
sets, Horovod's handles, and hvd.join's bookkeeping."""
import horovod.torch as hvd

from horovod_ext.compression.generation import stale_names_reset
from horovod_ext.consensus.diloco import worker_process_sets
from horovod_ext.torch_common.collectives import Collectives
from horovod_ext.torch_common.parameter_sync import Transfer, TorchParameterBackend
from .backend import TorchBackend, barrier_over_every_rank, numpy_allgather
from .optimizer import _LIVE_OPTIMIZERS


class HorovodCollectives(Collectives):
    """Horovod's: process sets, the plan's TorchBackend, hvd.join's bookkeeping."""

    @staticmethod
    def parameter_backend(params, stats):
        return HorovodParameterBackend(params, stats)

    rank = property(lambda self: hvd.rank())
    size = property(lambda self: hvd.size())

    @staticmethod
    def backend(group, stats):
        return TorchBackend(group, hvd.Average, 1.0, stats)

    @staticmethod
    def group_size(group):
        return hvd.size() if group is None else group.size()

    @staticmethod
    def worker_groups(settings):
        return worker_process_sets(settings, hvd.size(), hvd.add_process_set, barrier_over_every_rank)

    @staticmethod
    def numpy_allgather(group):
        return numpy_allgather(group)

    @staticmethod
    def broadcast_(tensor, root, group, name):
        where = {} if group is None else {"process_set": group}
        hvd.broadcast_(tensor, root_rank=root, name=name, **where)

    @staticmethod
    def allreduce_sum(tensor, name):
        return hvd.allreduce(tensor, op=hvd.Sum, name=name)

    @staticmethod
    def broadcast_object(obj, root, name):
        return hvd.broadcast_object(obj, root_rank=root, name=name)

    @staticmethod
    def track(optimizer):
        _LIVE_OPTIMIZERS.add(optimizer)  # hvd.join() applies the exchange in flight first


class HorovodParameterBackend(TorchParameterBackend):
    """Horovod's torch collectives by handle (asynchronous rounds)."""

    def __init__(self, params, stats):
        super().__init__(params, stats)
        self.nranks, self.rank = hvd.size(), hvd.rank()

    def allgather(self, x, name):
        with stale_names_reset():
            return handles([hvd.allgather_async(x, name=name)], single=True)

    def broadcast(self, values, root, level, name):
        """The root sends a copy, so that its later steps do not change what is in flight."""
        members = range(self.nranks) if level is None else level.members
        rank = members[int(root)]
        where = {} if level is None else {"process_set": self.sets[level.name]}
        with stale_names_reset():
            return handles([hvd.broadcast_async(v.clone() if rank == self.rank else v, root_rank=rank,
                                                name=f"{name}.{i}", **where) for i, v in enumerate(values)])

    def allreduce_mean(self, values, name):
        with stale_names_reset():
            return handles([hvd.allreduce_async_(v, op=hvd.Average, name=f"{name}.{i}")
                            for i, v in enumerate(values)])

    @staticmethod
    def add_process_set(ranks):
        return hvd.add_process_set(ranks)

    @staticmethod
    def barrier():
        barrier_over_every_rank()


def handles(started, single=False):
    """A Transfer of Horovod handles."""
    return Transfer([lambda h=h: hvd.synchronize(h) for h in started], single=single)
