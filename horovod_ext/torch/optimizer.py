"""horovod_ext's DistributedOptimizer: Horovod's signature and behaviour, with payload compressors.

As in horovod.torch, the wrapper is a subclass of the user's optimizer class; a hook on every parameter starts the
gradient's communication as soon as backward has accumulated it (after ``backward_passes_per_step`` passes), and
``step()`` (or ``synchronize()``) waits for all of them, writes the averaged gradients and steps the optimizer.
What happens to the gradients between the hooks and step() is the framework-free plan of the compressor
(horovod_ext/compression/plan.py, registry.py), run on the PyTorch backend (backend.py): launch() in the hook,
finish() in synchronize().

Before the first collective of the first step, the ranks exchange their settings once; if they differ, every rank
raises SettingsMismatchError. A NaN/Inf gradient raises FloatingPointError on every rank at that step.
"""
import contextlib
import itertools
import warnings
import weakref

import horovod.torch as hvd
import torch
from horovod.common.process_sets import global_process_set

from horovod_ext import __version__
from horovod_ext.compression import CompressionStats, is_payload_compressor
from horovod_ext.compression.buckets import BucketPlan, check_bucket_cap_mb
from horovod_ext.compression.consistency import allgather_blobs, optimizer_settings
from horovod_ext.compression.context import StepContext
from horovod_ext.compression.lifecycle import HostCounters, TrainingRun
from horovod_ext.compression.horovod_args import (check_groups, check_named_parameters, check_predivide,
                                                  outside_process_set)
from horovod_ext.compression.specs import compression_name, describe_compression, element_limit, resolved_for
from .backend import TorchBackend, drain, numpy_allgather, timed_into
from horovod_ext.torch_common.kernels import check_gradient

_optimizer_ids = itertools.count()
_LIVE_OPTIMIZERS = weakref.WeakSet()  # this process's optimizers that leave work in flight, for complete_in_flight()


def complete_in_flight():
    """Every DistributedOptimizer (and DiLoCoOptimizer) takes in what its last step left in flight (GraVAC's
    readings, waited for at the next step otherwise; DiLoCo's fragment exchange, applied now). hvd.join() calls it
    first: a rank that joins with GraVAC's readings still pending can hang the others' next step
    (tests/workers/join_twice_worker.py), and an allgather still in flight when a rank joins fails in Horovod."""
    for optimizer in list(_LIVE_OPTIMIZERS):
        optimizer._hx_complete_in_flight()


STATE_KEY = "horovod_ext"
HOROVOD_OPTIMIZER_MODULE = "horovod.torch.optimizer"


def _op_name(op):
    names = {hvd.Average: "Average", hvd.Sum: "Sum", hvd.Adasum: "Adasum"}
    return names.get(op, str(op))


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, process_set, sparse_as_dense=False, bucket_cap_mb=25):
        super(self.__class__, self).__init__(params)
        self._hx_id = next(_optimizer_ids)
        _LIVE_OPTIMIZERS.add(self)
        self._hx_op = op
        self._hx_process_set = process_set
        self._hx_predivide = float(gradient_predivide_factor)
        self._hx_backward_passes = int(backward_passes_per_step)
        self._hx_bucket_cap_mb = check_bucket_cap_mb(bucket_cap_mb)

        all_params = [p for group in self.param_groups for p in group["params"]]
        by_id = check_named_parameters(named_parameters, all_params, "DistributedOptimizer")
        self._hx_names = {p: by_id.get(id(p), f"noname.{i}") for i, p in enumerate(all_params)}
        self._parameter_names = dict(self._hx_names)  # Horovod's attribute, read by tools and Horovod's tests
        self._hx_sparse_as_dense = bool(sparse_as_dense)
        self._hx_params = [p for p in all_params if p.requires_grad]
        self._hx_index = {p: i for i, p in enumerate(self._hx_params)}

        if is_payload_compressor(compression):
            limit = element_limit(compression)
            for p in self._hx_params:
                check_gradient(self._hx_names[p], p, f"Compression.{compression.name}", **limit)
        elif not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
            raise TypeError(f"compression must be one of hvd.Compression.none, fp16, ternary (or a Horovod "
                            f"Compressor), got {compression!r}")

        self._hx_stats = CompressionStats(compression_name(compression))
        self._hx_backend = TorchBackend(process_set, op, self._hx_predivide, self._hx_stats)
        # agreement, seed, checkpoints, elastic resets and the method (made once the settings are agreed)
        self._hx_run = TrainingRun(compression, StepContext(self._hx_stats, timer=timed_into), HostCounters(),
                                   self._hx_id, torch.initial_seed)
        self._hx_pending = {}
        self._hx_begun = False  # the driver has begun this step (at its first launch)
        self._hx_passes_left = {p: self._hx_backward_passes for p in self._hx_params}
        self._hx_should_synchronize = True
        self._hx_synchronized = False
        # a rank outside the process set steps on its own gradients, as Horovod's optimizer does there
        self._hx_outside = outside_process_set(process_set)
        self._hx_hooks = [] if self._hx_outside else [p.register_post_accumulate_grad_hook(self._hx_hook)
                                                      for p in self._hx_params]

    # ----------------------------------------------------------------------------------------------- agreement
    def _hx_agree(self):
        """Exchange settings before the first collective, and again after a checkpoint was loaded or an elastic
        reset (compression/lifecycle.py): SettingsMismatchError on every rank if they differ."""
        run = self._hx_run
        if run.agreed:
            return
        if run.driver is None:  # packing="auto": for where the parameters are now (a model moved to the GPU
            # after the optimizer was made included)
            on_gpu = bool(self._hx_params) and all(p.is_cuda for p in self._hx_params)
            run.compression = resolved_for(run.compression, "cuda" if on_gpu else "cpu")
        tensors = [(self._hx_names[p], tuple(p.shape), str(p.dtype)) for p in self._hx_params]
        settings = optimizer_settings(describe_compression(run.compression), _op_name(self._hx_op), tensors,
                                      self._hx_process_set.size(), __version__,
                                      backward_passes_per_step=self._hx_backward_passes,
                                      gradient_predivide_factor=self._hx_predivide,
                                      sparse_as_dense=self._hx_sparse_as_dense,
                                      bucket_cap_mb=self._hx_bucket_cap_mb)
        blobs = lambda blob: allgather_blobs(blob, numpy_allgather(self._hx_process_set),  # noqa: E731
                                             f"horovod_ext.settings.{self._hx_id}")
        run.agree(settings, blobs, self._hx_backend, [p.numel() for p in self._hx_params], self._hx_buckets())

    def _hx_buckets(self):
        """The payload compressors' buckets (compression/buckets.py), per dtype and device, in the parameters' order
        reversed; Horovod's own compressors (none, fp16) go to Horovod as they are, fused by its tensor fusion."""
        if not is_payload_compressor(self._hx_run.compression):
            return None
        return BucketPlan([(p.numel() * p.element_size(), (str(p.dtype), str(p.device))) for p in self._hx_params],
                          self._hx_bucket_cap_mb)

    def _hx_base_step(self, closure=None):
        """The wrapped optimizer's own step, without any collective (Horovod's state-creating step)."""
        return super(self.__class__, self).step(closure)

    def _hx_broadcast_state(self, root_rank):
        """horovod_ext's part of broadcast_optimizer_state: every rank takes root_rank's shared state now (one
        broadcast_object), and re-agrees settings at its next step. Residuals stay per rank (see resume.py)."""
        shared = hvd.broadcast_object(self._hx_run.shared_state(), root_rank=root_rank,
                                      name=f"horovod_ext.state.{self._hx_id}", process_set=self._hx_process_set)
        self._hx_run.offer_shared(shared)

    # -------------------------------------------------------------------------------------------- communication
    def _hx_launch(self, p):
        """Start one gradient's communication. A sparse gradient (nn.Embedding(sparse=True)) travels as Horovod
        sends it, an allgather of its indices and values, or, with ``sparse_as_dense=True``, as a dense gradient
        compressed like any other and made sparse again once averaged, as Horovod does (optimizers such as
        SparseAdam take only sparse gradients); compression/plan.py's SparseGather, picked by the step driver."""
        driver = self._hx_run.driver
        if not self._hx_begun:
            driver.begin(self._hx_run.counters.step, self._hx_run.counters.seed)
            self._hx_begun = True
        sparse = None
        if p.grad is not None and p.grad.is_sparse:
            sparse = "dense" if self._hx_sparse_as_dense else "gather"
        item = driver.item(self._hx_index[p], self._hx_names[p], p.grad, p.numel(), p.grad.element_size(), param=p,
                           sparse=sparse)
        return driver.launch(item)

    def _hx_hook(self, p):
        if p in self._hx_pending:
            raise AssertionError(
                f"gradient of {self._hx_names[p]!r} computed more than backward_passes_per_step="
                f"{self._hx_backward_passes} times before step(); call optimizer.synchronize() or raise "
                f"backward_passes_per_step")
        self._hx_passes_left[p] -= 1
        if self._hx_passes_left[p] == 0:
            self._hx_agree()
            self._hx_pending[p] = self._hx_launch(p)

    def synchronize(self):
        """Finish every gradient's communication and write the averaged gradients into .grad."""
        if self._hx_outside:
            self._hx_synchronized = True
            return
        self._hx_agree()
        for p in self._hx_params:
            if p not in self._hx_pending:  # not reached by this backward (or fewer passes): send what is there
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._hx_pending[p] = self._hx_launch(p)
        ordered = [self._hx_pending[p] for p in self._hx_params]
        self._hx_pending = {}
        self._hx_passes_left = {p: self._hx_backward_passes for p in self._hx_params}
        self._hx_begun = False
        counters = self._hx_run.counters
        try:
            self._hx_run.driver.finish(ordered, counters.step)
        finally:
            counters.step += 1
            self._hx_stats.end_step()
            self._hx_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Use after an explicit synchronize(), e.g. to clip the averaged gradients before step()."""
        self._hx_should_synchronize = False
        try:
            yield
        finally:
            self._hx_should_synchronize = True

    def step(self, closure=None):
        if self._hx_should_synchronize:
            if self._hx_synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(); this synchronizes twice")
            self.synchronize()
        self._hx_synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._hx_pending:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(); that drops gradients in flight")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    # ------------------------------------------------------------------------------------------ observability
    def compression_stats(self):
        """Bytes this rank sent vs dense, bits per element, bytes on the wire (ring formulas, see
        horovod_ext.compression.wire) and seconds compressing, decompressing and waiting on communication, for
        the last step and since the start. With adaptive_topk also the CF, both gains and the path of the last
        step, "planned_cf" (what the next step sends), "log": one entry per step (step, cf, path, gain_min, gain_c,
        theta_min, candidate_cf, step_seconds) to plot, and "throughput": the table the controller settles from
        ({cf sent: (mean gain x steps/s, steps)}), with "theta_ideal", the CF it settled on (None while exploring)."""
        run = self._hx_run
        observations = run.observations()
        stats = self._hx_stats.as_dict()  # after the observations: GraVAC takes in its last readings there
        stats["ranks"] = self._hx_backend.nranks  # this job's, also once Horovod has shut down (at exit)
        if "seed" in getattr(run.compression, "settings", {}):
            stats["seed"] = run.counters.seed
        stats.update(observations)
        return stats

    # --------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self):
        """The wrapped optimizer's state, plus horovod_ext's: the shared part (step counter, seed, statistics,
        GraVAC controller) and this rank's residuals, tagged with its rank and the job's size (see resume.py)."""
        state = super(self.__class__, self).state_dict()
        state[STATE_KEY] = self._hx_run.state_dict(self._hx_process_set.rank(), self._hx_process_set.size())
        return state

    # ------------------------------------------------------------------------------------------ elastic training
    def _hx_complete_in_flight(self):
        self._hx_run.complete_in_flight()

    def _hx_forget_in_flight(self):
        """Drop every collective in flight without waiting (Horovod failed under them, or is being reset); the
        step's launched gradients are dropped too, as load_state_dict() drops them."""
        self._hx_clear_step()
        self._hx_run.forget_in_flight()

    def _hx_clear_step(self):
        """No gradient of the step is pending any more: backward starts afresh."""
        self._hx_pending = {}
        self._hx_begun = False
        self._hx_passes_left = {p: self._hx_backward_passes for p in self._hx_params}
        self._hx_synchronized = False

    def _hx_elastic_reset(self):
        """After Horovod's elastic reset (shutdown and init, perhaps with another N; horovod_ext.torch.elastic):
        the backend is made for the new membership now, the method at the next step (TrainingRun.elastic_reset)."""
        self._hx_forget_in_flight()
        self._hx_run.elastic_reset()
        self._hx_backend = TorchBackend(self._hx_process_set, self._hx_op, self._hx_predivide, self._hx_stats)

    def load_state_dict(self, state_dict):
        """Load a checkpoint, on every rank or (Horovod's resume pattern) on one rank before
        broadcast_optimizer_state: the shared state is offered to every rank at the next settings exchange, this
        rank's own residuals are restored, anything in flight is dropped (as Horovod's load_state_dict does)."""
        state_dict = dict(state_dict)
        ours = state_dict.pop(STATE_KEY, None)
        if self._hx_pending:
            drain(list(item.future for item in self._hx_pending.values()))
            self._hx_run.abandon_step()
        self._hx_clear_step()
        self._hx_should_synchronize = True
        super(self.__class__, self).load_state_dict(state_dict)
        if ours is None:
            return
        ps = self._hx_process_set
        other = self._hx_run.load_state_dict(ours, ps.rank(), ps.size())
        if other is not None:
            warnings.warn(f"horovod_ext: this checkpoint holds the error-feedback residuals of rank {other[0]} of "
                          f"{other[1]}; rank {ps.rank()} of {ps.size()} starts from zero residuals (what that "
                          f"rank had not yet sent is dropped once)")


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1,
                         op=None, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set, bucket_cap_mb=25):
    """Wrap a torch optimizer for data-parallel training over Horovod, with gradient compression.

    The signature is horovod.torch.DistributedOptimizer's. ``compression`` takes hvd.Compression.none (default),
    fp16 (both by allreduce) or ternary (packed, by allgather; see horovod_ext.compressors.Ternary).
    ``op`` is hvd.Average (default) or hvd.Sum. ``op=hvd.Adasum`` with hvd.Compression.none or fp16 returns Horovod's
    own Adasum optimizer (on more than one rank it allreduces each parameter's change after a local step, not the
    gradients), as horovod.torch.DistributedOptimizer does; the payload compressors refuse it. ``num_groups`` and
    ``groups`` (Horovod's explicit grouping of allreduces) are refused with an error that says what to do; Horovod's
    tensor fusion batches the dense collectives. Sparse gradients
    (``nn.Embedding(sparse=True)``) travel as Horovod sends them, by allgather of indices and values, or densified
    (and then compressed like any dense gradient) with ``sparse_as_dense=True``.

    ``bucket_cap_mb`` (default 25, as DDP's): a payload compressor's per-tensor collectives are fused into one per
    bucket of at most that many megabytes of gradient (2**20 bytes), filled in reverse parameter order; each tensor
    is still encoded on its own, so the averages are the same bits (horovod_ext/compression/buckets.py). 0 keeps
    one collective per tensor.
    """
    if compression is None:
        compression = hvd.Compression.none
    if op is None:
        op = hvd.Average
    check_predivide(gradient_predivide_factor, op == hvd.Average)
    check_groups(num_groups, groups)
    check_bucket_cap_mb(bucket_cap_mb)
    if int(backward_passes_per_step) < 1:
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}")
    if op == hvd.Adasum:
        if is_payload_compressor(compression):
            raise ValueError(f"op=hvd.Adasum cannot be combined with Compression.{compression.name}; use hvd.Average "
                             f"or hvd.Sum with it, or Adasum with hvd.Compression.none or fp16")
        if hvd.size() > 1:
            return _horovod_adasum_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                                             process_set)
    body = dict(_DistributedOptimizer.__dict__)
    # Horovod's broadcast_optimizer_state recognizes its distributed optimizers by this module and, on a rank whose
    # optimizer has no state yet, then runs the wrapped optimizer's own step() (no collective) to create it.
    body["__module__"] = HOROVOD_OPTIMIZER_MODULE
    # the optimizer's own step (which this one calls) runs torch's step hooks: marked "hooked", this step is not
    # wrapped in them again, so a hook runs once per step (Horovod's own DistributedOptimizer runs it twice)
    body["step"].hooked = True
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), body)
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
                  gradient_predivide_factor, process_set, sparse_as_dense, bucket_cap_mb)
    wrapped.defaults = optimizer.defaults
    wrapped.state.update(optimizer.state)
    return wrapped


def _horovod_adasum_optimizer(optimizer, named_parameters, compression, backward_passes_per_step, process_set):
    """Horovod's _DistributedAdasumOptimizer, made as horovod.torch.DistributedOptimizer makes it for op=hvd.Adasum."""
    from horovod.torch.optimizer import _DistributedAdasumOptimizer

    if process_set is not global_process_set:
        raise NotImplementedError("op=hvd.Adasum does not support a process_set other than the global one (as in "
                                  "Horovod)")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedAdasumOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, int(backward_passes_per_step))
