"""The PyTorch backend of the communication plan over torch.distributed, with no Horovod (the contract:
horovod_ext/compression/backend.py): the tensor primitives of horovod_ext/torch_common/tensors.py, and
torch.distributed's asynchronous collectives on one process group (Gloo, or NCCL where the parameters are on CUDA).
A future is a work object, the output it fills, and what turns that output into the result.

torch.distributed matches collectives by their order on each rank, not by name (Horovod matches names): the plan
starts the same collectives in the same order on every rank (its buckets are sorted by parameter position and
flushed at the same point of the same program), so the names it gives are kept for error messages only.

Where Horovod's collectives and torch.distributed's differ, this backend does what Horovod does:
- an allgather concatenates the ranks' tensors along the first dimension, which may differ between ranks (a
  payload coded to a size of its content): the ranks' sizes are gathered first (one small collective, read on the
  host to size the output), then the tensors, padded to the largest;
- an alltoall sends x cut by per-rank counts: the counts are exchanged first (the receiver must know its parts'
  sizes), then the parts;
- op "average" sums, then multiplies by 1 / N, as Horovod's postscale does;
- a sparse allreduce allgathers the indices and the values and builds the sparse sum, as Horovod's;
- a host tensor still travels over NCCL, as Horovod sends one by its CPU path: NCCL takes CUDA tensors only, so a
  host-made step tensor (ternary's shared scales, auto's measurements) is copied to the current CUDA device for the
  collective, and its result back to the host.
"""
import time

import numpy as np
import torch
import torch.distributed as dist

from horovod_ext.torch_common.tensors import Done, TorchTensors, timed_into

# torch >= 2.13 names it all_gather_single (all_gather_into_tensor, the same call, warns there)
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "average": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def chained(*steps):
    """The steps (None skipped) applied in order to a collective's output; None where there is none."""
    steps = [s for s in steps if s is not None]
    if not steps:
        return None

    def applied(output):
        for step in steps:
            output = step(output)
        return output

    return applied


def to_host(output):
    return output.cpu()


class Work:
    """A collective in flight: torch.distributed's work object, the tensor it fills, and what turns that tensor
    into the result (None: the tensor itself), applied once however often the result is waited for."""

    __slots__ = ("work", "output", "_post")

    def __init__(self, work, output, post=None):
        self.work, self.output, self._post = work, output, post

    @property
    def post(self):
        return None if self._post is None else self._finish

    def _finish(self, output):
        if self._post is not None:  # post may scale in place: the first wait applies it, later ones read it
            self.output, self._post = self._post(output), None
        return self.output


class LinearCompressor:
    """Horovod's Compression.none / fp16 semantics (compress before an allreduce, decompress after), for what
    Compression.auto sends by allreduce: fp16 casts floating tensors to float16 and back to their dtype."""

    HOROVOD_NAMES = {"none": "NoneCompressor", "fp16": "FP16Compressor"}

    def __init__(self, name):
        if name not in self.HOROVOD_NAMES:
            raise ValueError(f"linear compressor must be 'none' or 'fp16', got {name!r}")
        self.name = name
        self.__name__ = self.HOROVOD_NAMES[name]  # what the ranks' settings compare, as Horovod's class names
        self.identity = name == "none"  # sends the tensor as it is: a bucket's are fused (buckets.FusingBackend)

    def __repr__(self):
        return f"Compression.{self.name}"

    def compress(self, tensor):
        if self.name == "fp16" and tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, dtype):
        return tensor if dtype is None else tensor.to(dtype)


NONE = LinearCompressor("none")


def numpy_allgather(group=None):
    """allgather(array, name) -> the ranks' NumPy arrays concatenated (consistency.allgather_blobs), over
    torch.distributed's object allgather."""

    def allgather(array, name):
        arrays = [None] * dist.get_world_size(group)
        dist.all_gather_object(arrays, np.asarray(array), group=group)
        return np.concatenate(arrays)

    return allgather


class DDPBackend(TorchTensors):
    """Collectives by torch.distributed work objects on `group` (None: the default group); ``average``: the
    gradients' op is the mean (else the sum); ``outside_of``: the global ranks of a group this rank is not in (then
    rank is None and nothing is communicated, as Horovod's backend outside its process set)."""

    carries_futures = True  # a work object may be waited for in a later step

    def __init__(self, group, stats, average=True, outside_of=None):
        super().__init__(stats)
        self.group = group
        outside = outside_of is not None
        self.nranks, self.rank = (len(outside_of), None) if outside else (dist.get_world_size(group),
                                                                           dist.get_rank(group))
        self.divisor = float(self.nranks) if average else 1.0
        # NCCL's collectives take CUDA tensors only: host-made ones are staged on the current CUDA device
        nccl = not outside and dist.get_backend(group) == "nccl"
        self.staging = torch.device("cuda", torch.cuda.current_device()) if nccl else None

    def _staged(self, x):
        """x where the group's backend takes it, and what brings a result back to x's device (None: nothing)."""
        if self.staging is None or x.is_cuda:
            return x, None
        return x.to(self.staging), to_host

    def ranks_training(self, name):
        """None: torch.distributed has no hvd.join(); every rank of the group is taken to train every step. (DDP's
        model.join() for uneven inputs calls the hook on a joined rank with zero gradients, so that rank runs the
        whole plan; that is not tested.)"""
        return None

    @staticmethod
    def linear_compressor(name):
        return LinearCompressor(name)

    # -------------------------------------------------------------------------------------------- collectives
    def _all_reduce(self, x, op, post=None):
        x, back = self._staged(x)
        work = dist.all_reduce(x, op=REDUCE_OPS[op], group=self.group, async_op=True)
        scale = 1.0 / self.nranks
        return Work(work, x, chained((lambda out: out.mul_(scale)) if op == "average" else None, back, post))

    def allreduce(self, x, name, op):
        return self._all_reduce(x.clone(), op)

    def allreduce_grad(self, item, name, compression=None):
        compression = compression or NONE
        if getattr(compression, "identity", False):
            compressed, ctx = compression.compress(item.grad)
        else:
            with timed_into(self.stats, "compress_seconds"):
                compressed, ctx = compression.compress(item.grad)
        sent = compressed.numel() * compressed.element_size()
        buffer = compressed.clone() if compressed is item.grad else compressed
        return self._all_reduce(buffer, "average" if self.divisor != 1.0 else "sum",
                                lambda out: compression.decompress(out, ctx)), sent

    def allreduce_buffer(self, x, name):
        return self._all_reduce(x, "average" if self.divisor != 1.0 else "sum")

    def allreduce_sparse(self, item, name):
        grad = item.grad  # sent as it is, duplicate indices included (as Horovod sends it)
        sent = grad._values().numel() * grad.element_size() + grad._indices().numel() * 8
        values = self.wait(self.allgather(grad._values(), name + ".values"))
        indices = self.wait(self.allgather(grad._indices().transpose(0, 1).contiguous(), name + ".indices"))
        if self.divisor != 1.0:
            values = values / self.divisor
        return Done(torch.sparse_coo_tensor(indices.transpose(0, 1), values, grad.size())), sent

    def allgather(self, x, name):
        x, back = self._staged(x.reshape(1) if x.dim() == 0 else x.contiguous())
        count = torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device)
        counts = torch.empty(self.nranks, dtype=torch.int64, device=x.device)
        all_gather_single(counts, count, group=self.group)
        counts = counts.tolist()
        rows = max(counts)
        padded = x if x.shape[0] == rows else torch.cat([x, x.new_zeros((rows - x.shape[0],) + tuple(x.shape[1:]))])
        out = x.new_empty((self.nranks * rows,) + tuple(x.shape[1:]))
        work = all_gather_single(out, padded, group=self.group, async_op=True)
        if all(c == rows for c in counts):
            return Work(work, out, back)
        return Work(work, out, chained(lambda o: torch.cat([o[r * rows:r * rows + c] for r, c in enumerate(counts)]),
                                       back))

    def alltoall(self, x, splits, name):
        start = time.perf_counter()
        splits = [int(s) for s in (splits.tolist() if torch.is_tensor(splits) else splits)]
        x, back = self._staged(x)
        sending = torch.tensor(splits, dtype=torch.int64, device=x.device)
        receiving = torch.empty_like(sending)
        dist.all_to_all_single(receiving, sending, group=self.group)
        received = receiving.tolist()
        out = x.new_empty((sum(received),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=received, input_split_sizes=splits,
                               group=self.group)
        self.stats.add(comm_seconds=time.perf_counter() - start)
        return Done(out if back is None else back(out))

    @staticmethod
    def completed(future):
        future.work.wait()
        return future.output
