"""horovod_ext's DistributedOptimizer: Horovod's signature and behaviour, with payload compressors.

As in horovod.torch, the wrapper is a subclass of the user's optimizer class; a hook on every parameter starts the
gradient's communication as soon as backward has accumulated it (after ``backward_passes_per_step`` passes), and
``step()`` (or ``synchronize()``) waits for all of them, writes the averaged gradients and steps the optimizer.
Linear compressors (Compression.none, fp16) travel by allreduce; payload compressors (Compression.ternary) by
allgather, decoded and averaged natively (see transport.py).

Before the first collective of the first step, the ranks exchange their settings once; if they differ, every rank
raises SettingsMismatchError. A NaN/Inf gradient raises FloatingPointError on every rank at that step.
"""
import contextlib
import itertools
import warnings

import horovod.torch as hvd
import torch
from horovod.common.process_sets import global_process_set

from horovod_ext import __version__
from horovod_ext.compression import CompressionStats, SettingsMismatchError, is_payload_compressor
from horovod_ext.compression.consistency import agree, optimizer_settings, split_blobs
from horovod_ext.compression.specs import describe_compression, element_limit
from .ternary import check_gradient
from .transport import AllreduceTransport, TernaryTransport, TopKTransport

_optimizer_ids = itertools.count()
STATE_KEY = "horovod_ext"


def _op_name(op):
    names = {hvd.Average: "Average", hvd.Sum: "Sum", hvd.Adasum: "Adasum"}
    return names.get(op, str(op))


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, process_set):
        super(self.__class__, self).__init__(params)
        self._hx_id = next(_optimizer_ids)
        self._hx_compression = compression
        self._hx_op = op
        self._hx_process_set = process_set
        self._hx_predivide = float(gradient_predivide_factor)
        self._hx_backward_passes = int(backward_passes_per_step)
        if self._hx_backward_passes < 1:
            raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}")
        if op == hvd.Adasum and is_payload_compressor(compression):
            raise ValueError(f"op=hvd.Adasum cannot be combined with Compression.{compression.name}; "
                             f"use hvd.Average or hvd.Sum")

        all_params = [p for group in self.param_groups for p in group["params"]]
        named = list(named_parameters) if named_parameters is not None else []
        if named and any(not isinstance(item, tuple) or len(item) != 2 for item in named):
            raise ValueError("named_parameters must be a sequence of (name, parameter) pairs, "
                             "e.g. model.named_parameters()")
        names = [name for name, _ in named]
        if len(set(names)) != len(names):
            dups = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"named_parameters holds duplicate names: {dups}")
        by_param = {p: name for name, p in named}
        if named and any(p not in by_param for p in all_params):
            raise ValueError("named_parameters must name every parameter the optimizer updates "
                             "(pass model.named_parameters() of the model whose parameters it holds)")
        self._hx_names = {p: by_param.get(p, f"noname.{i}") for i, p in enumerate(all_params)}
        self._hx_params = [p for p in all_params if p.requires_grad]

        if is_payload_compressor(compression):
            limit = element_limit(compression)
            for p in self._hx_params:
                check_gradient(self._hx_names[p], p, f"Compression.{compression.name}", **limit)
        elif not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
            raise TypeError(f"compression must be one of hvd.Compression.none, fp16, ternary (or a Horovod "
                            f"Compressor), got {compression!r}")

        self._hx_stats = CompressionStats(getattr(compression, "name", getattr(compression, "__name__", "custom")))
        self._hx_transport = None  # made after the settings check (the seed may come from rank 0)
        self._hx_agreement = None  # None: not checked yet; True: agreed; an exception: re-raised
        self._hx_seed = None
        self._hx_step = 0
        self._hx_transport_state = None  # restored before the transport exists
        self._hx_pending = {}
        self._hx_passes_left = {p: self._hx_backward_passes for p in self._hx_params}
        self._hx_should_synchronize = True
        self._hx_synchronized = False
        self._hx_hooks = [p.register_post_accumulate_grad_hook(self._hx_hook) for p in self._hx_params]

    # ----------------------------------------------------------------------------------------------- agreement
    def _hx_allgather_blobs(self, blob):
        ps, tag = self._hx_process_set, f"horovod_ext.settings.{self._hx_id}"
        data = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        sizes = hvd.allgather(torch.tensor([data.numel()], dtype=torch.int64), name=tag + ".sizes",
                              process_set=ps).tolist()
        return split_blobs(hvd.allgather(data, name=tag, process_set=ps).numpy().tobytes(), sizes)

    def _hx_agree(self):
        """Exchange settings once (two small allgathers); raise SettingsMismatchError on every rank if they differ."""
        if self._hx_agreement is True:
            return
        if isinstance(self._hx_agreement, Exception):
            raise self._hx_agreement
        tensors = [(self._hx_names[p], tuple(p.shape), str(p.dtype)) for p in self._hx_params]
        settings = optimizer_settings(describe_compression(self._hx_compression), _op_name(self._hx_op), tensors,
                                      self._hx_process_set.size(), __version__,
                                      backward_passes_per_step=self._hx_backward_passes,
                                      gradient_predivide_factor=self._hx_predivide)
        try:
            proposal = agree(settings, self._hx_allgather_blobs)
        except SettingsMismatchError as exc:
            self._hx_agreement = exc
            raise
        seed = getattr(self._hx_compression, "seed", None)
        if self._hx_seed is None:
            self._hx_seed = seed if seed is not None else proposal["seed"]
        self._hx_transport = self._hx_make_transport()
        self._hx_agreement = True

    def _hx_make_transport(self):
        comp, ps, stats = self._hx_compression, self._hx_process_set, self._hx_stats
        if is_payload_compressor(comp) and comp.name in ("topk", "adaptive_topk"):
            transport = TopKTransport(comp, self._hx_op, ps, stats)
            if self._hx_transport_state is not None:
                transport.load_state(self._hx_transport_state)
            return transport
        if is_payload_compressor(comp):
            dense = AllreduceTransport(hvd.Compression.none, self._hx_op, self._hx_predivide, ps, stats)
            stats.extra["seed"] = self._hx_seed
            sizes = [p.numel() for p in self._hx_params if p.numel() >= comp.min_size]
            return TernaryTransport(comp, self._hx_op, ps, stats, dense, self._hx_seed, sizes)
        return AllreduceTransport(comp, self._hx_op, self._hx_predivide, ps, stats)

    # -------------------------------------------------------------------------------------------- communication
    def _hx_hook(self, p):
        if p in self._hx_pending:
            raise AssertionError(
                f"gradient of {self._hx_names[p]!r} computed more than backward_passes_per_step="
                f"{self._hx_backward_passes} times before step(); call optimizer.synchronize() or raise "
                f"backward_passes_per_step")
        self._hx_passes_left[p] -= 1
        if self._hx_passes_left[p] == 0:
            self._hx_agree()
            self._hx_pending[p] = self._hx_transport.launch(self._hx_names[p], p, self._hx_step)

    def synchronize(self):
        """Finish every gradient's communication and write the averaged gradients into .grad."""
        self._hx_agree()
        for p in self._hx_params:
            if p not in self._hx_pending:  # not reached by this backward (or fewer passes): send what is there
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._hx_pending[p] = self._hx_transport.launch(self._hx_names[p], p, self._hx_step)
        ordered = [self._hx_pending[p] for p in self._hx_params]
        self._hx_pending = {}
        self._hx_passes_left = {p: self._hx_backward_passes for p in self._hx_params}
        try:
            errors = self._hx_transport.finish(ordered, self._hx_step)
        finally:
            self._hx_step += 1
            self._hx_stats.end_step()
        self._hx_synchronized = True
        if errors:
            raise FloatingPointError(
                f"Compression.{self._hx_compression.name}: NaN or Inf in the gradient of {', '.join(errors)} at "
                f"step {self._hx_step - 1}; gradients must be finite (lower the learning rate, or clip gradients)")

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
        step, and "log": one entry per step (step, cf, path, gain_min, gain_c, theta_min, candidate_cf) to plot."""
        stats = self._hx_stats.as_dict()
        stats["ranks"] = self._hx_process_set.size()
        controller = getattr(self._hx_transport, "controller", None)
        if controller is not None:
            stats["log"] = [dict(e) for e in controller.log]
        return stats

    # --------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self):
        state = super(self.__class__, self).state_dict()
        transport = self._hx_transport.state() if hasattr(self._hx_transport, "state") else self._hx_transport_state
        state[STATE_KEY] = {"step": self._hx_step, "seed": self._hx_seed, "stats": self._hx_stats.state(),
                            "transport": transport}
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        ours = state_dict.pop(STATE_KEY, None)
        super(self.__class__, self).load_state_dict(state_dict)
        if ours is not None:
            self._hx_step = int(ours["step"])
            if ours["seed"] is not None and self._hx_transport is None:
                self._hx_seed = int(ours["seed"])
            self._hx_stats.load_state(ours["stats"])
            if ours.get("transport") is not None:
                if hasattr(self._hx_transport, "load_state"):
                    self._hx_transport.load_state(ours["transport"])
                else:
                    self._hx_transport_state = ours["transport"]


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1,
                         op=None, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set):
    """Wrap a torch optimizer for data-parallel training over Horovod, with gradient compression.

    The signature is horovod.torch.DistributedOptimizer's. ``compression`` takes hvd.Compression.none (default),
    fp16 (both by allreduce) or ternary (packed, by allgather; see horovod_ext.compression.Ternary).
    ``op`` is hvd.Average (default) or hvd.Sum (hvd.Adasum too with linear compressors). ``num_groups`` and
    ``groups`` (Horovod's grouping of allreduces) only tune how Horovod batches messages; Horovod's tensor fusion
    batches them here, so they are accepted and change no result. ``sparse_as_dense`` is not needed: sparse
    gradients are not supported by payload compressors and are rejected with a clear error.
    """
    if compression is None:
        compression = hvd.Compression.none
    if op is None:
        op = hvd.Average
    if isinstance(gradient_predivide_factor, bool) or not isinstance(gradient_predivide_factor, (int, float)) \
            or not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor must be a number > 0, got {gradient_predivide_factor!r}")
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor != 1.0 is only allowed with op=hvd.Average")
    del num_groups, groups, sparse_as_dense
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
                  gradient_predivide_factor, process_set)
    wrapped.defaults = optimizer.defaults
    wrapped.state.update(optimizer.state)
    return wrapped
