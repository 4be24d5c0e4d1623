"""The PyTorch backend of the communication plan (horovod_ext/compression/plan.py has the contract): Horovod's
asynchronous collectives (a future is a handle, waited for in ``wait``), the native kernels, residuals as tensors,
errors collected eagerly and raised by the optimizer once the step is finished."""
import contextlib
import math
import os
import time

import horovod.torch as hvd
import numpy as np
import torch
from horovod.common.exceptions import HorovodInternalError

from horovod_ext.compression.backend import Backend
from horovod_ext.compression.horovod_args import outside_process_set
from horovod_ext.compression.generation import named, stale_names_reset
from horovod_ext.compression.plan import k_of
from .kernels import TorchKernels, as_float32

OPS = {"sum": hvd.Sum, "average": hvd.Average, "max": hvd.Max}
DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64, "int32": torch.int32,
          "int64": torch.int64, "uint8": torch.uint8}
NAMES = {dtype: name for name, dtype in DTYPES.items()}


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


class Done:
    """A collective that has completed (Horovod's blocking alltoall)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


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


# HVDEXT_SYNC_TIMING=1: timed blocks wait for the GPU at their start and end, so that compress_seconds and
# decompress_seconds hold the CUDA kernels' time rather than their launch's (each wait costs the overlap it removes).
SYNC_TIMING = os.environ.get("HVDEXT_SYNC_TIMING", "0") == "1"


def _device_barrier():
    if SYNC_TIMING and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextlib.contextmanager
def timed_into(stats, field):
    """Add the seconds the block lasts to statistics field `field` (with HVDEXT_SYNC_TIMING=1, its GPU work's too)."""
    _device_barrier()
    start = time.perf_counter()
    try:
        yield
    finally:
        _device_barrier()
        stats.add(**{field: time.perf_counter() - start})


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


class FiniteBounds:
    """all_finite's truth, still on the tensor's device: its min and max (NaN propagates through both), finite
    exactly where every element is. all_true reads the step's truths together; bool() reads this one alone."""

    __slots__ = ("low", "high")

    def __init__(self, low, high):
        self.low, self.high = low, high

    def __bool__(self):
        return math.isfinite(float(self.low)) and math.isfinite(float(self.high))


class TorchBackend(Backend):
    """Eager: collectives by Horovod handle, requirements collected as (error, message) and raised by the step
    driver once the step is finished. Collective names carry the reset generation (compression/generation.py),
    which the optimizer sets once the ranks have agreed it."""

    kernels = TorchKernels
    kernel_errors = (ValueError,)  # how a kernel rejects a corrupted payload
    carries_futures = True  # a Horovod handle may be waited for in a later step

    def __init__(self, process_set, op, predivide, stats):
        self.process_set, self.stats = process_set, stats
        # this rank's place in the set (None outside it, where Horovod raises and nothing is communicated)
        self.nranks, self.rank = process_set.size(), None if outside_process_set(process_set) else process_set.rank()
        self.divisor = float(self.nranks) if op == hvd.Average else 1.0
        if op == hvd.Average and predivide != 1.0:
            # Same mean, summed at a smaller magnitude (Horovod's fp16 overflow guard).
            self.grad_op, self.prescale, self.postscale = hvd.Sum, 1.0 / predivide, predivide / self.nranks
        else:
            self.grad_op, self.prescale, self.postscale = op, 1.0, 1.0
        self.round = 0
        self.generation = 0
        self.prefix = ""  # put before a tensor's name in its collectives' names: an optimizer's own (DiLoCo's)

    def end_step(self, dense):
        """Only steps every rank takes advance the round in step-level collective names: a rank that has called
        hvd.join() takes no part in the dense steps of the others."""
        if not dense:
            self.round += 1

    def ranks_training(self, name):
        with stale_names_reset():
            handle = hvd.allreduce_async(torch.ones(1, dtype=torch.int32), op=hvd.Sum, name=name,
                                         process_set=self.process_set)
        return Future(handle, lambda count: int(count.item()))

    # ------------------------------------------------------------------------------------------------ tensors
    @staticmethod
    def flat32(g):
        return as_float32(g)

    @staticmethod
    def copy(x):
        return x.clone()

    @staticmethod
    def stack(values, dtype):
        return torch.tensor([float(v) for v in values], dtype=DTYPES[dtype])

    @staticmethod
    def unstack(t, n):
        return t.tolist()

    @staticmethod
    def inner_products(a, b):
        a, b = a.double(), b.double()
        return torch.stack([torch.dot(a, b), torch.dot(a, a), torch.dot(b, b)])

    @staticmethod
    def linear_compressor(name):
        return getattr(hvd.Compression, name)

    @staticmethod
    def concat(parts):
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @staticmethod
    def dtype_name(x):
        return NAMES[x.dtype]

    @staticmethod
    def bitcast(x, dtype):
        target = DTYPES[dtype]
        width = max(x.element_size(), torch.empty(0, dtype=target).element_size())
        if x.storage_offset() * x.element_size() % width or not x.is_contiguous():
            x = x.clone()  # a view of another dtype starts on a whole element of the wider one
        return x.view(target)

    @staticmethod
    def sum(values):
        return sum(values, 0.0)

    @staticmethod
    def sub(a, b, in_place=False):
        return a.sub_(b) if in_place else torch.sub(a, b)

    @staticmethod
    def size(x):
        return x.numel()

    @staticmethod
    def equal(x, value):
        return x == value

    @staticmethod
    def no_flag():
        return -1

    @staticmethod
    def nothing(dtype):
        return Done(torch.empty(0, dtype=DTYPES[dtype]))

    @staticmethod
    def all_finite(x):
        """No NaN or Inf in x, as FiniteBounds on x's device (no host read: all_true reads the step's truths
        together). Its min and max (NaN propagates through both) are one vectorized pass without a
        temporary, where isfinite(x).all() writes a boolean tensor of x's size first (the time of each:
        benchmarks/RESULTS.md, section "Figures moved out of the package's docstrings (issue 67)")."""
        if isinstance(x, float):
            return math.isfinite(x)
        if x.numel() == 0:
            return True
        if x.dtype == torch.bool or not (x.is_floating_point() or x.is_complex()):
            return True
        return FiniteBounds(*torch.aminmax(x.reshape(-1)))

    @staticmethod
    def all_finite_rows(x):
        """Boolean tensors on x's device (all_true reads them with the step's other truths)."""
        return list(torch.isfinite(x).all(1).unbind()) if x.numel() else [True] * x.shape[0]

    @staticmethod
    def all_true(truths):
        """Python bools of the truths, one host read per device: all_finite's bounds (per dtype) and equal's
        boolean tensors become one boolean vector on their device, read at once."""
        out = [None if isinstance(t, (FiniteBounds, torch.Tensor)) else bool(t) for t in truths]
        bounds, flags = {}, {}  # (device, dtype) -> positions of FiniteBounds; device -> positions of tensors
        for i, t in enumerate(truths):
            if isinstance(t, FiniteBounds):
                bounds.setdefault((t.low.device, t.low.dtype), []).append(i)
            elif out[i] is None:
                flags.setdefault(t.device, []).append(i)
        per_device = {}  # device -> [(positions, boolean vector)]
        for (device, _), positions in bounds.items():
            pairs = torch.stack([b for i in positions for b in (truths[i].low, truths[i].high)])
            per_device.setdefault(device, []).append((positions, torch.isfinite(pairs).view(-1, 2).all(1)))
        for device, positions in flags.items():
            per_device.setdefault(device, []).append(
                (positions, torch.stack([truths[i].reshape(()).to(torch.bool) for i in positions])))
        for parts in per_device.values():
            values = torch.cat([vector for _, vector in parts]).tolist()
            for i, value in zip((i for positions, _ in parts for i in positions), values):
                out[i] = value
        return out

    @staticmethod
    def k_of(numel, cf, upper=None):
        k = k_of(numel, cf)
        return k if upper is None else min(k, upper)

    # ------------------------------------------------------------------------------------ matrices (PowerSGD)
    @staticmethod
    def shape(x):
        return tuple(x.shape)

    @staticmethod
    def reshape(x, shape):
        return x.reshape(shape)

    @staticmethod
    def split(x, sizes):
        return list(torch.split(x, list(sizes)))

    @staticmethod
    def cast(x, dtype):
        return x.to(DTYPES[dtype])

    @staticmethod
    def scale(x, factor):
        return x * factor

    @staticmethod
    def matmul(a, b, transpose_a=False, transpose_b=False):
        # A product with a few columns (M Q, M^T P) as the transpose of its transpose: on the CPU, bmm of a large
        # operand against a narrow one is faster in that layout (the values are the same sums; benchmarks/RESULTS.md,
        # section "Figures moved out of the package's docstrings (issue 67)")
        if transpose_a:
            return torch.bmm(b if transpose_b else b.transpose(1, 2), a).transpose(1, 2)
        if not transpose_b:
            return torch.bmm(b.transpose(1, 2), a.transpose(1, 2)).transpose(1, 2)
        return torch.bmm(a, b.transpose(1, 2))

    @staticmethod
    def orthogonalize(x, method="gram_schmidt"):
        if method == "qr":
            return torch.linalg.qr(x, mode="reduced").Q
        out = x.clone()
        tiny = torch.finfo(torch.float32).tiny
        for j in range(out.shape[2]):
            col = out[:, :, j:j + 1]
            # max|col| scaled to [1, 2) by a power of two first (exact): the norm of a column of tiny values does
            # not underflow (the NumPy reference's power_of_two_scale)
            biased = (col.abs().amax(dim=1, keepdim=True).view(torch.int32) >> 23) & 0xFF
            col *= ((254 - biased).clamp(1, 254) << 23).view(torch.float32)
            col /= torch.clamp(torch.linalg.vector_norm(col, dim=1, keepdim=True), min=tiny)
            if j + 1 < out.shape[2]:
                rest = out[:, :, j + 1:]
                rest -= torch.sum(col * rest, dim=1, keepdim=True) * col
        return out

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

    @staticmethod
    def densify(item):
        item.grad = item.grad.to_dense()
        if item.param is not None:
            item.param.grad = item.grad
        item.itemsize = item.grad.element_size()

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

    def wait(self, future):
        if isinstance(future, Done):
            return future.value
        start = time.perf_counter()
        # Horovod's sparse allreduce: its handle is a function that waits and builds the result
        output = future.handle() if isinstance(future, Deferred) else hvd.synchronize(future.handle)
        self.stats.add(comm_seconds=time.perf_counter() - start)
        return output if isinstance(future, Deferred) or future.post is None else future.post(output)

    def name(self, prefix, item):
        return named(f"{prefix}.{self.prefix}{item.name}", self.generation)

    def step_name(self, prefix):
        return named(f"{prefix}.{self.prefix}{self.round}", self.generation)

    def stable_name(self, prefix):
        return named(f"hvdext.{self.prefix}{prefix}", self.generation)

    # ------------------------------------------------------------------------------------------ host, control
    @staticmethod
    def host(fn, args, dtypes):
        result = fn(*[a.tolist() if isinstance(a, torch.Tensor) else a for a in args])
        return result if isinstance(result, tuple) else (result,)

    @staticmethod
    def eager(fn, args, dtypes):
        result = fn(*args)
        return result if isinstance(result, tuple) else (result,)

    @staticmethod
    def numpy(fn, args, dtypes):
        """A NumPy kernel on CPU copies of the tensors; results back as CPU tensors."""
        values = [a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a for a in args]
        result = fn(*values)
        result = result if isinstance(result, tuple) else (result,)
        return tuple(torch.from_numpy(np.ascontiguousarray(r, dtype=d) if np.ndim(r) else np.asarray(r, dtype=d))
                     for r, d in zip(result, dtypes))

    @staticmethod
    def switch(index, branches):
        return branches[int(index)]()

    @staticmethod
    def building_graph():
        """Never: PyTorch runs eagerly (the step context records requirements and counts as they come)."""
        return False

    @staticmethod
    def assertion(truth, data):
        if not truth:
            raise AssertionError("".join(str(d) for d in data))

    @staticmethod
    def after(ops, x):
        return x  # eager: what came before has run

    @staticmethod
    def scope(name):
        return contextlib.nullcontext()  # eager ops have no names

    def shared_state_read(self, method):
        """Nothing to take on: a checkpoint reaches the method only through the optimizer's load_state_dict(),
        which hands it to the method itself."""

    def shared_state_written(self, method):
        """Nothing to store: the optimizer's state_dict() reads Method.shared_state() when it is called."""

    # ------------------------------------------------------------------------------------------------- state
    @staticmethod
    def residual(name, n, item):
        return torch.zeros(n, dtype=torch.float32, device=item.grad.device)

    @staticmethod
    def read(state):
        return state

    @staticmethod
    def assign(state, value):
        if value is not state:
            state.copy_(value)

    @staticmethod
    def reset(state):
        state.zero_()

    @staticmethod
    def export(state):
        return state.clone()

    @staticmethod
    def fused_states(states):
        first, last = states[0], states[-1]
        if len(states) == 1 and first.dim() == 1 and first.is_contiguous():
            return first, [first]
        storage = first.untyped_storage().data_ptr()
        consecutive = all(
            s.dim() == 1 and s.dtype == torch.float32 and s.is_contiguous()
            and s.untyped_storage().data_ptr() == storage and s.storage_offset() == p.storage_offset() + p.numel()
            for p, s in zip(states, states[1:]))
        if consecutive and first.dim() == 1 and first.is_contiguous():
            total = last.storage_offset() + last.numel() - first.storage_offset()
            return first.as_strided((total,), (1,)), list(states)
        buffer = torch.cat([s.reshape(-1) for s in states]) if len(states) > 1 else states[0].reshape(-1).clone()
        return buffer, list(torch.split(buffer, [s.numel() for s in states]))

    @staticmethod
    def imported_residual(name, values):
        return values.clone().float()

    @staticmethod
    def imported(values):
        return values.float()

    # ------------------------------------------------------------------------------------------------ output
    @staticmethod
    def output_buffer(item):
        grad = item.grad
        return grad.view(-1) if grad.dtype == torch.float32 and grad.is_contiguous() else None

    @staticmethod
    def write(item, flat):
        if flat.is_sparse:  # allreduce_sparse's result
            item.param.grad = flat
            return
        grad = item.grad
        if flat.data_ptr() != grad.data_ptr() or flat.dtype != grad.dtype:
            grad.copy_(flat.view_as(grad) if flat.numel() == grad.numel() else flat)
        if item.sparse is not None:  # sent dense: handed back sparse, as Horovod does (SparseAdam takes no other)
            item.param.grad = grad.to_sparse()
