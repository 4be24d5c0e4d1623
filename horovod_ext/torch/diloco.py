"""DiLoCoOptimizer for PyTorch: H local steps of the wrapped optimizer, then an outer Nesterov step on the ranks'
averaged pseudo-gradients, sent through any compressor of the plan (horovod_ext/consensus/diloco.py has the math).

    opt = hvd.DiLoCoOptimizer(torch.optim.AdamW(model.parameters(), lr=4e-4), model.named_parameters(),
                              inner_steps=50, compression=hvd.Compression.ternary(error_feedback=True))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()   # every 50th step: the outer round
    with opt.evaluation_parameters():                                  # the outer parameters
        evaluate(model)

Every rank is a worker: its gradients are not averaged between rounds. The wrapped optimizer's state (AdamW's
moments, its learning-rate schedule) stays each rank's own across rounds, as in DiLoCo and its open
implementations. The outer parameters start as rank 0's parameters at the first step.
"""
import contextlib
import itertools

import horovod.torch as hvd
import torch
from horovod.common.process_sets import global_process_set

from horovod_ext import __version__
from horovod_ext.compression import CompressionStats
from horovod_ext.compression.consistency import allgather_blobs, optimizer_settings
from horovod_ext.compression.context import StepContext
from horovod_ext.compression.horovod_args import check_named_parameters
from horovod_ext.compression.lifecycle import HostCounters, TrainingRun
from horovod_ext.compression.specs import describe_compression, resolved_for
from horovod_ext.consensus.accounting import account_dense_reference
from horovod_ext.consensus.agreement import build_on_every_rank
from horovod_ext.consensus.diloco import DiLoCoSettings, exchange, outer_update
from .backend import TorchBackend, numpy_allgather, timed_into
from .wrapping import StateInCheckpoint, wrap

_ids = itertools.count()


class _DiLoCo(StateInCheckpoint):
    """Horovod's API around DiLoCo's outer loop; mixed in before the user's optimizer class, so super() reaches
    the user's optimizer (its step is the inner step)."""

    _hx_what = "DiLoCoOptimizer"

    def _hx_setup(self, named_parameters, arguments, compression):
        self._hx_id = next(_ids)
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        names = check_named_parameters(named_parameters, params, self._hx_what)
        self._hx_params = params
        self._hx_names = [names.get(id(p), f"param.{i}") for i, p in enumerate(params)]
        tensors = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(self._hx_names, params)]
        self._hx_settings = build_on_every_rank(lambda: DiLoCoSettings(**arguments), arguments, tensors,
                                                self._hx_allgather_blobs, hvd.rank(), hvd.size(), self._hx_what)
        self._hx_stats = CompressionStats(getattr(compression, "name", getattr(compression, "__name__", "custom")))
        self._hx_backend = TorchBackend(global_process_set, hvd.Average, 1.0, self._hx_stats)
        self._hx_run = TrainingRun(compression, StepContext(self._hx_stats, timer=timed_into), HostCounters(),
                                   f"diloco{self._hx_id}", torch.initial_seed, what=f"horovod_ext {self._hx_what}")
        self._hx_inner = 0  # inner steps taken
        self._hx_outer = None  # the outer parameters (float32), once the first step has taken rank 0's
        self._hx_momentum = None  # the outer momentum b, after the first round
        self._hx_update_norm = None  # |theta_new - theta| of the last round

    def _hx_allgather_blobs(self, blob):
        return allgather_blobs(blob, numpy_allgather(), f"horovod_ext.{self._hx_what}.{self._hx_id}.settings")

    # -------------------------------------------------------------------------------------------------- a step
    def step(self, closure=None):
        """The inner step (the wrapped optimizer's); every inner_steps-th, then the outer round."""
        if self._hx_outer is None:
            self._hx_start()
        self._hx_agree()  # at a step every rank takes, before it counts: a loaded checkpoint's counts are taken on
        loss = super().step(closure)
        with torch.no_grad():
            self._hx_inner += 1
            if self._hx_inner % self._hx_settings.inner_steps == 0:
                self._hx_outer_round()
            else:  # data-parallel SGD's allreduce of this step's gradients: the bytes not sent
                account_dense_reference(self._hx_stats, sum(p.numel() for p in self._hx_params),
                                        sum(p.numel() * p.element_size() for p in self._hx_params), hvd.size())
            self._hx_stats.end_step()
        return loss

    @torch.no_grad()
    def _hx_start(self):
        """The outer parameters: rank 0's (one broadcast; every rank continues from them)."""
        for i, p in enumerate(self._hx_params):
            hvd.broadcast_(p, root_rank=0, name=f"horovod_ext.diloco.{self._hx_id}.start.{i}")
        self._hx_outer = [p.detach().float().clone() for p in self._hx_params]

    def _hx_agree(self):
        run = self._hx_run
        if run.agreed:
            return
        if run.driver is None:
            on_gpu = bool(self._hx_params) and all(p.is_cuda for p in self._hx_params)
            run.compression = resolved_for(run.compression, "cuda" if on_gpu else "cpu")
        tensors = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(self._hx_names, self._hx_params)]
        settings = optimizer_settings(describe_compression(run.compression), "average", tensors, hvd.size(),
                                      __version__, diloco=self._hx_settings.describe())
        blobs = lambda blob: allgather_blobs(blob, numpy_allgather(),  # noqa: E731
                                             f"horovod_ext.diloco.{self._hx_id}.exchange")
        run.agree(settings, blobs, self._hx_backend, [p.numel() for p in self._hx_params])

    def _hx_outer_round(self):
        """Delta_m = theta - theta_m through the plan, then the outer step; every rank continues from theta."""
        s, run = self._hx_settings, self._hx_run
        deltas = [theta - p.detach().float() for theta, p in zip(self._hx_outer, self._hx_params)]
        delta = exchange(run.driver, self._hx_names, deltas, run.counters.step, run.counters.seed,
                         lambda item: item.grad)
        run.counters.step += 1
        outer, self._hx_momentum = outer_update(self._hx_outer, self._hx_momentum, delta, s.outer_lr,
                                                s.outer_momentum, s.nesterov)
        self._hx_update_norm = float(torch.sqrt(sum(((new - old) ** 2).sum(dtype=torch.float64)
                                                    for new, old in zip(outer, self._hx_outer))))
        self._hx_outer = outer
        for p, theta in zip(self._hx_params, outer):
            p.copy_(theta)

    # ------------------------------------------------------------------------------------------- observability
    def compression_stats(self):
        """Bytes this rank handed to collectives (the outer rounds' pseudo-gradients) against data-parallel SGD's
        allreduce of the gradients at every step; the outer rounds and the last outer update's norm."""
        stats = self._hx_stats.as_dict()
        stats.update(self._hx_run.observations())
        stats.update(optimizer=self._hx_what, ranks=hvd.size(), inner_steps=self._hx_settings.inner_steps,
                     inner_steps_taken=self._hx_inner, outer_rounds=self._hx_run.counters.step,
                     outer_update_norm=self._hx_update_norm)
        return stats

    @contextlib.contextmanager
    def evaluation_parameters(self):
        """Inside the block the model holds the outer parameters (the same on every rank), its own after."""
        if self._hx_outer is None:
            yield
            return
        with torch.no_grad():
            own = [p.detach().clone() for p in self._hx_params]
            for p, theta in zip(self._hx_params, self._hx_outer):
                p.copy_(theta)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, value in zip(self._hx_params, own):
                    p.copy_(value)

    # ------------------------------------------------------------------------------------------- checkpoints
    def _hx_ours(self):
        """DiLoCo's part of state_dict(): inner steps taken, outer parameters and momentum, the exchange's step
        counter, seed, statistics and this rank's error-feedback residuals."""
        clone = lambda values: None if values is None else [v.clone() for v in values]  # noqa: E731
        return {"inner": self._hx_inner, "outer": clone(self._hx_outer), "momentum": clone(self._hx_momentum),
                "update_norm": self._hx_update_norm,
                "run": self._hx_run.state_dict(hvd.rank(), hvd.size())}

    def _hx_load_ours(self, ours):
        device = self._hx_params[0].device if self._hx_params else None
        moved = lambda values: None if values is None else [v.clone().to(device) for v in values]  # noqa: E731
        self._hx_inner = int(ours["inner"])
        self._hx_outer, self._hx_momentum = moved(ours["outer"]), moved(ours["momentum"])
        self._hx_update_norm = ours.get("update_norm")
        self._hx_run.load_state_dict(ours["run"], hvd.rank(), hvd.size())

    def _hx_broadcast_state(self, root_rank):
        """DiLoCo's part of broadcast_optimizer_state: root_rank's inner step count, outer parameters and
        momentum, and the exchange's shared state on every rank (residuals stay each rank's own)."""
        ours = hvd.broadcast_object({k: v for k, v in self._hx_ours().items() if k != "run"}, root_rank=root_rank,
                                    name=f"horovod_ext.diloco.{self._hx_id}.state")
        device = self._hx_params[0].device if self._hx_params else None
        moved = lambda values: None if values is None else [v.to(device) for v in values]  # noqa: E731
        self._hx_inner, self._hx_update_norm = int(ours["inner"]), ours["update_norm"]
        self._hx_outer, self._hx_momentum = moved(ours["outer"]), moved(ours["momentum"])
        shared = hvd.broadcast_object(self._hx_run.shared_state(), root_rank=root_rank,
                                      name=f"horovod_ext.diloco.{self._hx_id}.shared")
        self._hx_run.offer_shared(shared)


def DiLoCoOptimizer(optimizer, named_parameters=None, inner_steps=50, outer_lr=0.7, outer_momentum=0.9,
                    nesterov=True, compression=None):
    """DiLoCo (Douillard et al. 2023) over Horovod: wrap a torch optimizer (the inner one, AdamW in the paper).

    Every rank takes ``inner_steps`` steps of its own optimizer on its own gradients; then the ranks average their
    pseudo-gradients (outer parameters minus their own) through ``compression`` (any of hvd.Compression's:
    error feedback keeps what a compressor drops for the next round) and an outer SGD step with Nesterov
    momentum moves the outer parameters: b = mu b + Delta, theta -= outer_lr (Delta + mu b); every rank continues
    from theta. Construction is collective: bad or differing arguments raise the same error on every rank."""
    arguments = {"inner_steps": inner_steps, "outer_lr": outer_lr, "outer_momentum": outer_momentum,
                 "nesterov": nesterov}
    wrapped = wrap(_DiLoCo, optimizer)
    wrapped._hx_setup(named_parameters, arguments, compression if compression is not None else hvd.Compression.none)
    return wrapped
