"""The parameter-space optimizers' collectives over torch.distributed (torch_common/collectives.py's contract):
the default group and groups made from it, work objects. Where torch.distributed's collectives and Horovod's
differ, these do what Horovod does: a broadcast fills a new tensor (the receiver's parameters are not overwritten
in flight), and a mean is the sum multiplied by 1 / N (Horovod's postscale)."""
import torch.distributed as dist

from horovod_ext.torch_common.collectives import Collectives
from horovod_ext.torch_common.parameter_sync import Transfer, TorchParameterBackend
from .backend import DDPBackend, all_gather_single, numpy_allgather


def made_groups():
    """group_of(ranks): the torch.distributed group of those global ranks, made once: None for every rank (the
    default group), an Outside where this rank is not in it. dist.new_group is collective over the default group:
    every rank asks for the same rank lists in the same order."""
    made = {}

    def group_of(ranks):
        key = tuple(sorted(ranks))
        if len(key) == dist.get_world_size():
            return None
        if key not in made:
            group = dist.new_group(list(key))
            made[key] = group if dist.get_rank() in key else Outside(list(key))
        return made[key]

    return group_of


class Outside:
    """A group this rank is not in: its global ranks (dist.new_group gives every such rank one shared marker, which
    cannot tell the groups apart)."""

    def __init__(self, members):
        self.members = members


class DistCollectives(Collectives):
    """torch.distributed's, on the default group and groups made from it."""

    rank = property(lambda self: dist.get_rank())
    size = property(lambda self: dist.get_world_size())

    @staticmethod
    def parameter_backend(params, stats):
        return DistParameterBackend(params, stats)

    @staticmethod
    def backend(group, stats):
        return DDPBackend(group, stats, outside_of=group.members if isinstance(group, Outside) else None)

    @staticmethod
    def group_size(group):
        return len(group.members) if isinstance(group, Outside) else dist.get_world_size(group)

    @staticmethod
    def worker_groups(settings):
        """Every rank makes every worker's group of more than one rank, then the leaders' (made_groups)."""
        group_of = made_groups()
        own = None
        for group in settings.workers:
            if len(group) > 1:
                made_group = group_of(group)
                if list(group) == list(settings.group):
                    own = made_group
        return own, group_of(settings.leaders)

    @staticmethod
    def numpy_allgather(group):
        return numpy_allgather(group)

    @staticmethod
    def broadcast_(tensor, root, group, name):
        dist.broadcast(tensor, src=root, group=group)

    @staticmethod
    def allreduce_sum(tensor, name):
        total = tensor.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def broadcast_object(obj, root, name):
        box = [obj]
        dist.broadcast_object_list(box, src=root)
        return box[0]


def started(work, output):
    """A waiter for one torch.distributed work object: its output once complete."""
    def wait():
        work.wait()
        return output
    return wait


class DistParameterBackend(TorchParameterBackend):
    """torch.distributed's collectives on the default group, by work object (asynchronous rounds)."""

    def __init__(self, params, stats):
        super().__init__(params, stats)
        self.nranks, self.rank = dist.get_world_size(), dist.get_rank()

    def allgather(self, x, name):
        out = x.new_empty((self.nranks * x.shape[0],) + tuple(x.shape[1:]))
        return Transfer([started(all_gather_single(out, x.contiguous(), async_op=True), out)], single=True)

    def broadcast(self, values, root, level, name):
        members = range(self.nranks) if level is None else level.members
        source = members[int(root)]
        group = None if level is None else self.sets[level.name]
        waits = []
        for v in values:
            buffer = v.clone()
            waits.append(started(dist.broadcast(buffer, src=source, group=group, async_op=True), buffer))
        return Transfer(waits)

    def allreduce_mean(self, values, name):
        scale = 1.0 / self.nranks

        def averaged(work, v):
            def wait():
                work.wait()
                return v.mul_(scale)
            return wait

        return Transfer([averaged(dist.all_reduce(v, async_op=True), v) for v in values])

    def add_process_set(self, ranks):
        return dist.new_group(sorted(ranks))

    def level_groups(self, sync):
        """The levels' torch.distributed groups: every group of more than one rank, then the levels' (made_groups)."""
        group_of = made_groups()
        for group in sync.groups:
            if len(group) > 1:
                group_of(group)
        return {level.name: group_of(level.members) for level in sync.levels if len(level.members) > 1}

    @staticmethod
    def barrier():
        dist.barrier()
