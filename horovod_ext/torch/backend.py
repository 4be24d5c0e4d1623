"""The PyTorch backend of the communication plan over Horovod (horovod_ext/compression/backend.py has the
contract): the tensor primitives of horovod_ext/torch_common/tensors.py, and Horovod's asynchronous collectives
(a future is a handle, waited for in ``wait``)."""
import time

import horovod.torch as hvd
import torch
from horovod.common.exceptions import HorovodInternalError

from horovod_ext.compression.horovod_args import outside_process_set
from horovod_ext.compression.generation import stale_names_reset
from horovod_ext.torch_common.tensors import Done, TorchTensors, timed_into  # noqa: F401  (timed_into: re-exported)

OPS = {"sum": hvd.Sum, "average": hvd.Average, "max": hvd.Max}


class Future:
    """A collective in flight: Horovod's handle, and what turns its output into the result."""

    __slots__ = ("handle", "post")

    def __init__(self, handle, post=None):
        self.handle, self.post = handle, post


class Deferred:
    """Horovod's sparse allreduce in flight: a function that waits for its allgathers and returns the result."""

    __slots__ = ("handle",)

    def __init__(self, handle):
        self.handle = handle


def numpy_allgather(process_set=None):
    """allgather(array, name) -> NumPy array over Horovod's torch allgather (consistency.allgather_blobs)."""
    where = {} if process_set is None else {"process_set": process_set}

    def allgather(array, name):
        with stale_names_reset():
            return hvd.allgather(torch.from_numpy(array), name=name, **where).numpy()

    return allgather


def barrier_over_every_rank():
    """Return once every rank has called this: a one-element allreduce over all ranks
    (in_flight.leave_together)."""
    hvd.allreduce(torch.zeros(1), name="horovod_ext.leave_together", op=hvd.Sum)


def drain(futures):
    """Wait for (and discard) every collective still in flight, so that none is left in Horovod's handle map."""
    for future in futures:
        handle = future if callable(future) else getattr(future, "handle", None)
        if handle is None:
            continue
        try:
            handle() if callable(handle) else hvd.synchronize(handle)
        except HorovodInternalError:
            pass


class TorchBackend(TorchTensors):
    """Collectives by Horovod handle over a process set; the rest is TorchTensors'."""

    carries_futures = True  # a Horovod handle may be waited for in a later step

    def __init__(self, process_set, op, predivide, stats):
        super().__init__(stats)
        self.process_set = process_set
        # this rank's place in the set (None outside it, where Horovod raises and nothing is communicated)
        self.nranks, self.rank = process_set.size(), None if outside_process_set(process_set) else process_set.rank()
        self.divisor = float(self.nranks) if op == hvd.Average else 1.0
        if op == hvd.Average and predivide != 1.0:
            # Same mean, summed at a smaller magnitude (Horovod's fp16 overflow guard).
            self.grad_op, self.prescale, self.postscale = hvd.Sum, 1.0 / predivide, predivide / self.nranks
        else:
            self.grad_op, self.prescale, self.postscale = op, 1.0, 1.0

    def ranks_training(self, name):
        with stale_names_reset():
            handle = hvd.allreduce_async(torch.ones(1, dtype=torch.int32), op=hvd.Sum, name=name,
                                         process_set=self.process_set)
        return Future(handle, lambda count: int(count.item()))

    @staticmethod
    def linear_compressor(name):
        return getattr(hvd.Compression, name)

    # -------------------------------------------------------------------------------------------- collectives
    def allreduce(self, x, name, op):
        with stale_names_reset():
            return Future(hvd.allreduce_async(x, name=name, op=OPS[op], process_set=self.process_set))

    def allreduce_grad(self, item, name, compression=None):
        compression = compression or hvd.Compression.none
        if compression is hvd.Compression.none:
            compressed, ctx = compression.compress(item.grad)
        else:
            with timed_into(self.stats, "compress_seconds"):
                compressed, ctx = compression.compress(item.grad)
        sent = compressed.numel() * compressed.element_size()
        with stale_names_reset():
            handle = hvd.allreduce_async_(compressed, name=name, op=self.grad_op, prescale_factor=self.prescale,
                                          postscale_factor=self.postscale, process_set=self.process_set)
        return Future(handle, lambda output: compression.decompress(output, ctx)), sent

    def allreduce_buffer(self, x, name):
        with stale_names_reset():
            return Future(hvd.allreduce_async_(x, name=name, op=self.grad_op, prescale_factor=self.prescale,
                                               postscale_factor=self.postscale, process_set=self.process_set))

    def allreduce_sparse(self, item, name):
        grad = item.grad  # sent as it is, duplicate indices included (Horovod does not coalesce it)
        sent = grad._values().numel() * grad.element_size() + grad._indices().numel() * 8
        with stale_names_reset():
            handle = hvd.sparse_allreduce_async(grad, name=name, op=hvd.Average if self.divisor != 1.0 else hvd.Sum,
                                                process_set=self.process_set)
        return Deferred(handle), sent

    def allgather(self, x, name):
        with stale_names_reset():
            return Future(hvd.allgather_async(x, name=name, process_set=self.process_set))

    def alltoall(self, x, splits, name):
        start = time.perf_counter()
        splits = splits.to(torch.int32) if torch.is_tensor(splits) else torch.tensor(splits, dtype=torch.int32)
        with stale_names_reset():
            received, _ = hvd.alltoall(x, splits=splits, name=name, process_set=self.process_set)
        self.stats.add(comm_seconds=time.perf_counter() - start)
        return Done(received)

    @staticmethod
    def completed(future):
        # Horovod's sparse allreduce: its handle is a function that waits and builds the result
        return future.handle() if isinstance(future, Deferred) else hvd.synchronize(future.handle)
