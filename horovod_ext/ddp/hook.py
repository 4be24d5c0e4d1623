"""horovod_ext's compressors as a DDP communication hook: DDP's buckets are the plan's buckets.

    import horovod_ext.ddp as hx
    model = torch.nn.parallel.DistributedDataParallel(model)
    state = hx.CompressionState(hx.Compression.ternary, named_parameters=model.named_parameters())
    model.register_comm_hook(state, hx.comm_hook)

DDP's reducer calls the hook once per bucket (``GradBucket``: a flat buffer, its parameters and their gradients,
views into the buffer), in the same bucket order on every rank, and waits for the futures at the end of backward.
A step runs as in the Horovod path (horovod_ext/torch/optimizer.py), the same framework-free plan over another
backend (backend.py, torch.distributed's collectives):

- before the first bucket of the first step (and after a checkpoint was loaded) the ranks agree on the settings
  (compression/lifecycle.py: SettingsMismatchError on every rank if they differ), and on the draws' seed;
- the first bucket of an iteration begins the step (step counter and seed: the same draws as the Horovod path);
- each bucket's gradients are launched through the step driver as one bucket of the plan
  (compression/buckets.py ``GivenBuckets``): one encode where the codec encodes buckets, one collective per kind
  of collective, started now, so that they travel while backward goes on;
- the last bucket (``bucket.is_last()``) finishes the step: every bucket's collectives are waited for and decoded
  into the buckets' buffers (each tensor by its own rule: TernGrad's per-layer scale, top-k's per-layer k, error
  feedback's residual per parameter), and the futures handed to DDP for every bucket are completed. A step's
  error (a NaN/Inf gradient, a corrupted payload: decided from collective results, the same on every rank)
  completes them with the exception, which DDP raises from ``backward()``; error feedback drops what it kept and
  the next step trains normally.

Each tensor is encoded and decoded as the Horovod path does, keyed by its name (the draws) and its position (the
order of PowerSGD's factors), so the same seeded script gives the same bits both ways at 2 ranks.
"""
import warnings

import torch
import torch.distributed as dist

from horovod_ext import __version__
from horovod_ext.compression import CompressionStats, is_payload_compressor
from horovod_ext.compression.buckets import GivenBuckets
from horovod_ext.compression.consistency import allgather_blobs, optimizer_settings
from horovod_ext.compression.context import StepContext
from horovod_ext.compression.horovod_args import check_named_parameters
from horovod_ext.compression.lifecycle import HostCounters, TrainingRun
from horovod_ext.compression.wire import allreduce_wire_bytes
from horovod_ext.compression.specs import compression_name, describe_compression, element_limit, resolved_for
from horovod_ext.torch_common.kernels import check_gradient
from horovod_ext.torch_common.tensors import timed_into

from .backend import DDPBackend, LinearCompressor, numpy_allgather
from .compression import Compression

DDP_PREFIX = "module."  # DistributedDataParallel's names: those of the model it wraps, behind this prefix
WHAT = "horovod_ext.ddp CompressionState"


def plain_names(named):
    """(name, parameter) pairs with DDP's "module." prefix removed where every name has it: a DDP model's
    parameters are named as those of the model it wraps (what the Horovod path and checkpoints of that model use)."""
    named = list(named)
    if named and all(isinstance(n, str) and n.startswith(DDP_PREFIX) for n, _ in named):
        named = [(n[len(DDP_PREFIX):], p) for n, p in named]
    return named


def check_compression(compression):
    if is_payload_compressor(compression) or isinstance(compression, LinearCompressor):
        return compression
    raise TypeError(f"{WHAT}: compression must be one of hx.Compression.none, fp16, ternary, topk, adaptive_topk, "
                    f"powersgd or auto, got {compression!r}")


class CompressionState:
    """The state of horovod_ext's DDP communication hook (``comm_hook``), for one DDP model.

    ``compression``: any hx.Compression (default none: DDP's own averaging, by allreduce), with the arguments and
    defaults it has in the Horovod path. ``process_group``: the torch.distributed group DDP reduces over (None: the
    default group; pass the one given to DistributedDataParallel). ``named_parameters``: the model's (name,
    parameter) pairs, e.g. ``model.named_parameters()`` (DDP's "module." prefix is removed): the tensors' names key
    the random draws, name residuals in checkpoints and errors, and their order is the Horovod path's parameter
    order. Required with every compressor but none and fp16, which average a bucket's buffer by one allreduce
    as DDP's default hook and torch's fp16 hook do.

    ``compression_stats()``: bytes and seconds, as DistributedOptimizer's; ``state_dict()`` / ``load_state_dict()``:
    horovod_ext's entry of a checkpoint (step, seed, statistics, the method's shared state and this rank's
    error-feedback residuals by parameter name), the same entry as the Horovod path's optimizer checkpoint holds
    under "horovod_ext"."""

    def __init__(self, compression=None, process_group=None, named_parameters=None):
        self.compression = check_compression(Compression.none if compression is None else compression)
        if named_parameters is None and is_payload_compressor(self.compression):
            raise ValueError(f"{WHAT}: Compression.{self.compression.name} needs named_parameters (pass "
                             f"named_parameters=model.named_parameters()): the names key its random draws and "
                             f"its residuals in checkpoints")
        named = plain_names(named_parameters or [])
        check_named_parameters(named, None, WHAT)
        self.params = [p for _, p in named if p.requires_grad]
        self.names = {p: n for n, p in named}
        self.index = {p: i for i, p in enumerate(self.params)}
        self.linear = isinstance(self.compression, LinearCompressor)  # none, fp16: a bucket by one allreduce
        if is_payload_compressor(self.compression):
            for p in self.params:
                check_gradient(self.names[p], p, f"Compression.{self.compression.name}",
                               **element_limit(self.compression))
        self.process_group = process_group
        self.stats = CompressionStats(compression_name(self.compression))
        self.backend = DDPBackend(process_group, self.stats)
        self.run = TrainingRun(self.compression, StepContext(self.stats, timer=timed_into), HostCounters(),
                               "ddp", torch.initial_seed, what=WHAT)
        self.buckets = GivenBuckets()
        self.items, self.futures = [], []  # this step's launched gradients, and the futures handed to DDP
        self.begun = False  # the driver has begun this step (at its first bucket)
        self.handed = 0  # buckets DDP has handed this step

    # ----------------------------------------------------------------------------------------------- a bucket
    def _agree(self):
        run = self.run
        if run.driver is None:  # packing="auto": for where the parameters are
            on_gpu = bool(self.params) and all(p.is_cuda for p in self.params)
            run.compression = resolved_for(run.compression, "cuda" if on_gpu else "cpu")
        tensors = [(self.names[p], tuple(p.shape), str(p.dtype)) for p in self.params]
        settings = optimizer_settings(describe_compression(run.compression), "Average", tensors,
                                      self.backend.nranks, __version__, adapter="ddp")
        blobs = lambda blob: allgather_blobs(blob, numpy_allgather(self.process_group),  # noqa: E731
                                             "horovod_ext.settings.ddp")
        run.agree(settings, blobs, self.backend, [p.numel() for p in self.params], self.buckets)

    def _positions(self, parameters):
        positions = [self.index.get(p) for p in parameters]
        if None in positions:
            raise ValueError(f"{WHAT}: DDP handed a gradient of a parameter named_parameters does not hold (a "
                             f"{tuple(parameters[positions.index(None)].shape)} tensor); pass the "
                             f"named_parameters of the model DistributedDataParallel wraps")
        return positions

    def launch(self, bucket):
        """One DDP bucket: its gradients launched as one bucket of the plan; the future DDP waits for. Where
        launching raises (a settings mismatch, a gradient DDP should not have handed), the step is dropped and the
        error raised from backward."""
        try:
            return self._launch(bucket)
        except Exception:
            self._drop_step()
            raise

    def _drop_step(self):
        if self.begun:
            self.run.abandon_step()
        self.items, self.futures, self.begun, self.handed = [], [], False, 0
        self.buckets.clear()

    def _launch(self, bucket):
        if bucket.index() == 0 and self.begun:  # the last backward stopped before its last bucket (it raised)
            self._drop_step()
        buffer = bucket.buffer()
        if buffer.is_sparse:
            raise ValueError(f"{WHAT}: sparse gradients are not supported by the hook (DDP buckets them apart); "
                             f"use dense embeddings, or Compression.none")
        run = self.run
        if not self.begun:  # the iteration's first bucket
            if not run.agreed:
                self._agree()
            run.driver.begin(run.counters.step, run.counters.seed)
            self.begun = True
        if self.linear:
            future = self._allreduce_bucket(buffer)
        else:
            parameters, gradients = bucket.parameters(), bucket.gradients()
            positions = self._positions(parameters)
            self.buckets.add(positions)
            for index, p, grad in zip(positions, parameters, gradients):
                item = run.driver.item(index, self.names[p], grad, grad.numel(), grad.element_size(), param=p)
                self.items.append(run.driver.launch(item))
            pending = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
            self.futures.append((pending, buffer))
            future = pending.then(settled)
        self.handed += 1
        if bucket.is_last():
            self._finish()
        return future

    def _allreduce_bucket(self, buffer):
        """none / fp16: the bucket's buffer (cast to float16 by fp16) summed by one allreduce and divided by N, as
        DDP's default hook and torch's fp16_compress_hook do; counted as the plan counts a dense gradient."""
        compression, context, be = self.run.compression, self.run.context, self.backend
        with context.timed("compress_seconds"):
            sent, dtype = compression.compress(buffer)
        dense, payload = buffer.numel() * buffer.element_size(), sent.numel() * sent.element_size()
        context.count(dense_bytes=dense, elements=buffer.numel(), payload_bytes=payload,
                      dense_wire_bytes=allreduce_wire_bytes(dense, be.nranks),
                      wire_bytes=allreduce_wire_bytes(payload, be.nranks))
        work = dist.all_reduce(sent, group=self.process_group, async_op=True)
        scale = 1.0 / be.nranks
        return work.get_future().then(lambda done: compression.decompress(done.value()[0].mul_(scale), dtype))

    def _finish(self):
        """The step's last bucket was launched: finish every gradient, complete every future."""
        items = sorted(self.items, key=lambda item: item.index)
        futures, self.items, self.futures, self.begun = self.futures, [], [], False
        self.stats.extra["buckets"], self.handed = self.handed, 0  # DDP's buckets this step
        counters, error = self.run.counters, None
        try:
            self.run.driver.finish(items, counters.step)
        except Exception as exc:  # noqa: BLE001 - every rank's futures carry the step's error to DDP
            error = exc
        finally:
            self.buckets.clear()
            counters.step += 1
            self.stats.end_step()
        for future, buffer in futures:
            if error is None:
                future.set_result(buffer)
            else:
                future.set_exception(error)

    # ------------------------------------------------------------------------------------------ observability
    def compression_stats(self):
        """Bytes this rank sent against dense, bits per element, wire bytes, seconds compressing, decompressing and
        waiting, for the last step and since the start (as DistributedOptimizer.compression_stats())."""
        observations = self.run.observations()
        stats = self.stats.as_dict()
        stats["ranks"] = self.backend.nranks
        if "seed" in getattr(self.run.compression, "settings", {}):
            stats["seed"] = self.run.counters.seed
        stats.update(observations)
        return stats

    # --------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self):
        """horovod_ext's entry of a checkpoint (compression/resume.py): the shared part and this rank's residuals,
        tagged with its rank and the group's size."""
        return self.run.state_dict(self.backend.rank, self.backend.nranks)

    def load_state_dict(self, state):
        """Load state_dict()'s entry (or the "horovod_ext" entry of a Horovod-path optimizer checkpoint): the
        shared part is agreed at the next step, this rank's residuals restored; a step in progress is dropped."""
        self._drop_step()
        other = self.run.load_state_dict(state, self.backend.rank, self.backend.nranks)
        if other is not None:
            warnings.warn(f"horovod_ext: this checkpoint holds the error-feedback residuals of rank {other[0]} of "
                          f"{other[1]}; rank {self.backend.rank} of {self.backend.nranks} starts from zero "
                          f"residuals (what that rank had not yet sent is dropped once)")


def settled(future):
    """The bucket's average, or the step's error raised (a future chained by ``then`` completes with it as an
    error, which DDP's reducer raises from backward; set_exception alone stores the exception as the value)."""
    return future.value()


def comm_hook(state, bucket):
    """DDP's communication hook over horovod_ext's compressors: ``model.register_comm_hook(state, comm_hook)`` with
    a CompressionState. Returns a torch.futures.Future of the bucket's averaged gradients (see the module
    docstring for when it completes)."""
    if not isinstance(state, CompressionState):
        raise TypeError(f"horovod_ext.ddp.comm_hook takes a horovod_ext.ddp.CompressionState as its state, got "
                        f"{type(state).__name__}")
    if not callable(getattr(bucket, "buffer", None)):  # FSDP calls its hooks with shards' tensors
        raise TypeError(f"horovod_ext.ddp.comm_hook is DistributedDataParallel's communication hook: it takes DDP's "
                        f"GradBucket, got {type(bucket).__name__}. FSDP's communication hooks (a reduce-scatter of "
                        f"shards) are not supported: use DistributedDataParallel, or FSDP without horovod_ext's hook")
    return state.launch(bucket)

