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
from horovod_ext.compression.specs import compression_name, describe_compression, resolved_for

from horovod_ext.consensus.accounting import account_dense_reference
from horovod_ext.consensus.agreement import build_on_every_rank
from horovod_ext.consensus.diloco import (NO_COMPRESSION, DiLoCoSettings, averaged_pseudo_gradient, exchange,
                                          outer_update, worker_process_sets)
from .backend import TorchBackend, barrier_over_every_rank, numpy_allgather, timed_into
from .wrapping import StateInCheckpoint, wrap

_ids = itertools.count()


class _DiLoCo(StateInCheckpoint):
    """Horovod's API around DiLoCo's outer loop; mixed in before the user's optimizer class, so super() reaches
    the user's optimizer (its step is the inner step)."""

    _hx_what = "DiLoCoOptimizer"

    def _hx_setup(self, named_parameters, arguments, compression, inner_compression):
        self._hx_id = next(_ids)
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        names = check_named_parameters(named_parameters, params, self._hx_what)
        self._hx_params = params
        self._hx_names = [names.get(id(p), f"param.{i}") for i, p in enumerate(params)]
        self._hx_arguments = arguments
        self._hx_stats, self._hx_inner_stats = CompressionStats(compression_name(compression)), \
            CompressionStats(compression_name(inner_compression))
        self._hx_run = TrainingRun(compression, StepContext(self._hx_stats, timer=timed_into), HostCounters(),
                                   f"diloco{self._hx_id}", torch.initial_seed, what=f"horovod_ext {self._hx_what}")
        self._hx_inner_run = TrainingRun(inner_compression, StepContext(self._hx_inner_stats, timer=timed_into),
                                         HostCounters(), f"diloco{self._hx_id}.inner", torch.initial_seed,
                                         what=f"horovod_ext {self._hx_what} (inner steps)")
        self._hx_inner_described = describe_compression(inner_compression)
        self._hx_build()
        self._hx_inner = 0  # inner steps taken
        self._hx_outer = None  # the outer parameters (float32), once the first step has taken rank 0's
        self._hx_momentum = None  # the outer momentum b, after the first round
        self._hx_update_norm = None  # |theta_new - theta| of the last round

    def _hx_build(self):
        """The settings and the workers for the job's membership (collective: the arguments are checked on every
        rank, the groups become Horovod process sets); the backends of the outer exchange (over the leaders) and
        of the inner average (over this rank's worker)."""
        tensors = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(self._hx_names, self._hx_params)]
        compared = dict(self._hx_arguments, inner_compression=self._hx_inner_described)
        self._hx_settings = build_on_every_rank(
            lambda: DiLoCoSettings(size=hvd.size(), inner_compressed=self._hx_inner_described != NO_COMPRESSION,
                                   **self._hx_arguments),
            compared, tensors, self._hx_allgather_blobs, hvd.rank(), hvd.size(), self._hx_what)
        self._hx_group_set, leaders_set = worker_process_sets(self._hx_settings, hvd.size(), hvd.add_process_set,
                                                                   barrier_over_every_rank)
        self._hx_backend = TorchBackend(leaders_set, hvd.Average, 1.0, self._hx_stats)
        self._hx_inner_backend = None if self._hx_group_set is None else \
            TorchBackend(self._hx_group_set, hvd.Average, 1.0, self._hx_inner_stats)

    def _hx_forget_in_flight(self):
        """Drop the collectives in flight without waiting (Horovod failed under them, or is being reset)."""
        self._hx_run.forget_in_flight()
        self._hx_inner_run.forget_in_flight()

    def _hx_elastic_reset(self):
        """After Horovod's elastic reset (horovod_ext.torch.elastic): the workers are made again for the new
        membership (collective: settings checked on every rank, groups made into process sets again), and both
        plans at their next step, from this rank's state (its residuals carried over). The outer parameters,
        momentum and inner step count come back from the commit (restore) and then from rank 0 (sync)."""
        self._hx_run.elastic_reset()
        self._hx_inner_run.elastic_reset()
        self._hx_build()

    def _hx_allgather_blobs(self, blob):
        return allgather_blobs(blob, numpy_allgather(), f"horovod_ext.{self._hx_what}.{self._hx_id}.settings")

    # -------------------------------------------------------------------------------------------------- a step
    def step(self, closure=None):
        """The inner step (the wrapped optimizer's, on the gradients averaged over this rank's worker); every
        inner_steps-th, then the outer round."""
        if self._hx_outer is None:
            self._hx_start()
        self._hx_agree()  # at a step every rank takes, before it counts: a loaded checkpoint's counts are taken on
        if self._hx_inner_backend is not None:
            self._hx_average_in_group()
        loss = super().step(closure)
        with torch.no_grad():
            self._hx_inner += 1
            rounds = self._hx_inner % self._hx_settings.inner_steps == 0
            if rounds:
                self._hx_outer_round()
            if not rounds or not self._hx_settings.is_leader:
                # data-parallel SGD's allreduce of this step's gradients (a leader's round counts it in the plan)
                account_dense_reference(self._hx_stats, sum(p.numel() for p in self._hx_params),
                                        sum(p.numel() * p.element_size() for p in self._hx_params), hvd.size())
            self._hx_stats.end_step()
            if self._hx_inner_backend is not None:
                self._hx_inner_stats.end_step()
        return loss

    @torch.no_grad()
    def _hx_average_in_group(self):
        """The worker's gradients: the average over its ranks through inner_compression's plan (a missing
        gradient counts as zeros, as Horovod's DistributedOptimizer sends it)."""
        run = self._hx_inner_run
        for p in self._hx_params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self._hx_params]
        averaged = exchange(run.driver, self._hx_names, grads, run.counters.step, run.counters.seed,
                            lambda item: item.grad)
        run.counters.step += 1
        for p, g in zip(self._hx_params, averaged):
            if g is not p.grad:
                p.grad.copy_(g)

    @torch.no_grad()
    def _hx_start(self):
        """The outer parameters: rank 0's (one broadcast; every rank continues from them)."""
        for i, p in enumerate(self._hx_params):
            hvd.broadcast_(p, root_rank=0, name=f"horovod_ext.diloco.{self._hx_id}.start.{i}")
        self._hx_outer = [p.detach().float().clone() for p in self._hx_params]

    def _hx_agree(self):
        """The compression plans' settings exchange (every rank, collective), once and after a checkpoint was
        loaded or an elastic reset: the outer exchange's over all ranks, the inner average's over the worker."""
        sizes = [p.numel() for p in self._hx_params]
        tensors = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(self._hx_names, self._hx_params)]
        on_gpu = bool(self._hx_params) and all(p.is_cuda for p in self._hx_params)
        runs = [(self._hx_run, self._hx_backend, None, "exchange")]
        if self._hx_inner_backend is not None:
            runs.append((self._hx_inner_run, self._hx_inner_backend, self._hx_group_set, "inner"))
        for run, backend, process_set, tag in runs:
            if run.agreed:
                continue
            if run.driver is None:
                run.compression = resolved_for(run.compression, "cuda" if on_gpu else "cpu")
            settings = optimizer_settings(describe_compression(run.compression), "average", tensors,
                                          hvd.size() if process_set is None else process_set.size(),
                                          __version__, diloco=self._hx_settings.describe())
            blobs = lambda blob, where=process_set, tag=tag: allgather_blobs(  # noqa: E731
                blob, numpy_allgather(where), f"horovod_ext.diloco.{self._hx_id}.{tag}")
            run.agree(settings, blobs, backend, sizes)

    def _hx_outer_round(self):
        """Delta_m = theta - theta_m averaged over the workers (the leaders through the plan, then each leader to
        its group), then the outer step; every rank continues from theta."""
        s, run = self._hx_settings, self._hx_run
        deltas = [theta - p.detach().float() for theta, p in zip(self._hx_outer, self._hx_params)]

        def across_leaders(values):
            return exchange(run.driver, self._hx_names, values, run.counters.step, run.counters.seed,
                            lambda item: item.grad)

        def in_group(values):
            leader = s.group[0]
            for i, value in enumerate(values):
                hvd.broadcast_(value, root_rank=leader, process_set=self._hx_group_set,
                               name=f"horovod_ext.diloco.{self._hx_id}.share.{s.generation}.{i}")
            if hvd.rank() == leader:
                self._hx_inner_stats.add(payload_bytes=sum(v.numel() * v.element_size() for v in values))
            return values

        delta = averaged_pseudo_gradient(s, deltas, across_leaders, in_group)
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
        """Bytes this rank handed to the outer exchange (the rounds' pseudo-gradients, across workers) against
        data-parallel SGD's allreduce of the gradients over all ranks at every step; the outer rounds and the last
        outer update's norm; with groups, ``inner``: the bytes of the average inside this rank's worker (every
        step's gradients, the leader's broadcast of the round's average), ``workers`` and whether this rank is its
        worker's ``leader``."""
        stats = self._hx_stats.as_dict()
        stats.update(self._hx_run.observations())
        stats.update(optimizer=self._hx_what, ranks=hvd.size(), inner_steps=self._hx_settings.inner_steps,
                     inner_steps_taken=self._hx_inner, outer_rounds=self._hx_run.counters.step,
                     outer_update_norm=self._hx_update_norm, workers=self._hx_settings.workers,
                     leader=self._hx_settings.is_leader)
        if self._hx_inner_backend is not None:
            stats["inner"] = self._hx_inner_stats.as_dict()
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
        counter, seed, statistics and this rank's error-feedback residuals; the same of the inner average."""
        clone = lambda values: None if values is None else [v.clone() for v in values]  # noqa: E731
        return {"inner": self._hx_inner, "outer": clone(self._hx_outer), "momentum": clone(self._hx_momentum),
                "update_norm": self._hx_update_norm,
                "run": self._hx_run.state_dict(hvd.rank(), hvd.size()),
                "inner_run": self._hx_inner_run.state_dict(hvd.rank(), hvd.size())}

    def _hx_load_ours(self, ours):
        device = self._hx_params[0].device if self._hx_params else None
        moved = lambda values: None if values is None else [v.clone().to(device) for v in values]  # noqa: E731
        self._hx_inner = int(ours["inner"])
        self._hx_outer, self._hx_momentum = moved(ours["outer"]), moved(ours["momentum"])
        self._hx_update_norm = ours.get("update_norm")
        self._hx_run.load_state_dict(ours["run"], hvd.rank(), hvd.size())
        self._hx_inner_run.load_state_dict(ours["inner_run"], hvd.rank(), hvd.size())

    def _hx_broadcast_state(self, root_rank):
        """DiLoCo's part of broadcast_optimizer_state: root_rank's inner step count, outer parameters and
        momentum, and the exchange's shared state on every rank (residuals stay each rank's own)."""
        ours = hvd.broadcast_object({k: v for k, v in self._hx_ours().items() if not k.endswith("run")},
                                    root_rank=root_rank, name=f"horovod_ext.diloco.{self._hx_id}.state")
        device = self._hx_params[0].device if self._hx_params else None
        moved = lambda values: None if values is None else [v.to(device) for v in values]  # noqa: E731
        self._hx_inner, self._hx_update_norm = int(ours["inner"]), ours["update_norm"]
        self._hx_outer, self._hx_momentum = moved(ours["outer"]), moved(ours["momentum"])
        for run, tag in ((self._hx_run, "shared"), (self._hx_inner_run, "inner_shared")):
            shared = hvd.broadcast_object(run.shared_state(), root_rank=root_rank,
                                          name=f"horovod_ext.diloco.{self._hx_id}.{tag}")
            run.offer_shared(shared)


def DiLoCoOptimizer(optimizer, named_parameters=None, inner_steps=50, outer_lr=0.7, outer_momentum=0.9,
                    nesterov=True, compression=None, groups=None, inner_compression=None):
    """DiLoCo (Douillard et al. 2023) over Horovod: wrap a torch optimizer (the inner one, AdamW in the paper).

    Every worker takes ``inner_steps`` steps of its own optimizer on its own gradients; then the workers average
    their pseudo-gradients (outer parameters minus their own) through ``compression`` (any of hvd.Compression's:
    error feedback keeps what a compressor drops for the next round) and an outer SGD step with Nesterov
    momentum moves the outer parameters: b = mu b + Delta, theta -= outer_lr (Delta + mu b); every rank continues
    from theta.

    ``groups``: None, every rank is a worker; "node", the ranks of a host are one worker; or rank lists such as
    [[0, 1], [2, 3]]. A worker's ranks average their gradients at every inner step (an allreduce over the group,
    a Horovod process set, through ``inner_compression``) and its first rank alone sends at a round. Groups are
    process sets made after init: initialize with horovod_ext.torch.init() (or HOROVOD_DYNAMIC_PROCESS_SETS=1).

    Construction is collective: bad or differing arguments raise the same error on every rank."""
    arguments = {"inner_steps": inner_steps, "outer_lr": outer_lr, "outer_momentum": outer_momentum,
                 "nesterov": nesterov, "groups": groups}
    wrapped = wrap(_DiLoCo, optimizer)
    wrapped._hx_setup(named_parameters, arguments, compression if compression is not None else hvd.Compression.none,
                      inner_compression if inner_compression is not None else hvd.Compression.none)
    return wrapped
