"""What both PyTorch adapters share (Horovod's horovod_ext.torch and torch.distributed's horovod_ext.ddp): the
backend contract's primitives on torch tensors (horovod_ext/compression/backend.py), everything but the
collectives, which each adapter's backend adds (horovod_ext/torch/backend.py: Horovod's handles;
horovod_ext/ddp/backend.py: torch.distributed's work objects). Nothing here imports Horovod."""
import contextlib
import math
import os
import time

import numpy as np
import torch

from horovod_ext.compression.backend import Backend
from horovod_ext.compression.generation import named
from horovod_ext.compression.plan import k_of
from .kernels import TorchKernels, as_float32

DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64, "int32": torch.int32,
          "int64": torch.int64, "uint8": torch.uint8}
NAMES = {dtype: name for name, dtype in DTYPES.items()}


class Done:
    """A collective that has completed (Horovod's blocking alltoall)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


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


class FiniteBounds:
    """all_finite's truth, still on the tensor's device: its min and max (NaN propagates through both), finite
    exactly where every element is. all_true reads the step's truths together; bool() reads this one alone."""

    __slots__ = ("low", "high")

    def __init__(self, low, high):
        self.low, self.high = low, high

    def __bool__(self):
        return math.isfinite(float(self.low)) and math.isfinite(float(self.high))


class TorchTensors(Backend):
    """The contract's primitives on torch tensors, eagerly: requirements collected as (error, message) and raised
    by the step driver once the step is finished. Collective names carry the reset generation
    (compression/generation.py), which the optimizer sets once the ranks have agreed it; a subclass adds the
    collectives, ``ranks_training`` and ``linear_compressor``."""

    kernels = TorchKernels
    kernel_errors = (ValueError,)  # how a kernel rejects a corrupted payload

    def __init__(self, stats):
        self.stats = stats
        self.round = 0
        self.generation = 0
        self.prefix = ""  # put before a tensor's name in its collectives' names: an optimizer's own (DiLoCo's)

    def end_step(self, dense):
        """Only steps every rank takes advance the round in step-level collective names: a rank that has called
        hvd.join() takes no part in the dense steps of the others."""
        if not dense:
            self.round += 1

    def wait(self, future):
        """A collective's result: a Done's value at once, else the adapter's ``completed(future)`` (the seconds it
        waits counted as communication), then the future's ``post`` where it has one."""
        if isinstance(future, Done):
            return future.value
        start = time.perf_counter()
        output = self.completed(future)
        self.stats.add(comm_seconds=time.perf_counter() - start)
        post = getattr(future, "post", None)
        return output if post is None else post(output)

    def completed(self, future):
        """Wait for a collective the adapter started; its output."""
        raise NotImplementedError(f"{type(self).__name__} starts no collective")

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
    def concat(parts):
        """The parts joined; where they lie on several devices, the CPU's (stack's values made on the host: a
        bucket's size header) are moved to the other's."""
        if len(parts) == 1:
            return parts[0]
        devices = {p.device for p in parts}
        if len(devices) > 1:
            device = next(d for d in devices if d.type != "cpu")
            parts = [p.to(device) for p in parts]
        return torch.cat(parts)

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

    @staticmethod
    def densify(item):
        item.grad = item.grad.to_dense()
        if item.param is not None:
            item.param.grad = item.grad
        item.itemsize = item.grad.element_size()

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
