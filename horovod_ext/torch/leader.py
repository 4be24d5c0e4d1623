"""LeaderOptimizer (LSGD, multi-leader LSGD) and ElasticAveragingOptimizer (EASGD) for PyTorch.

Both replace gradient averaging: every rank steps its own optimizer on its own gradient, and every `period` steps
the parameters are pulled toward a leader's (LSGD) or a center's (EASGD). The whole step (schedule, election,
pulls, EASGD's update, byte accounting, asynchronous rounds, evaluation) is horovod_ext.consensus's (step.py); this
module supplies its backend, Horovod's torch collectives and the parameters, and Horovod's API around it.

    opt = hvd.LeaderOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters())
    loss = opt.step(closure)                     # or: loss.backward(); opt.report_loss(loss); opt.step()
    with opt.evaluation_parameters():            # the best worker's parameters (EASGD: the center)
        evaluate(model); torch.save(model.state_dict(), path)

The pull is applied just before the local optimizer step, so the force and the gradient (already computed) both
come from the same x, as in the papers' update. For optimizers whose step reads the parameters (weight decay),
the decay term sees the pulled parameters.

With ``asynchronous=True`` the rounds' collectives are started with Horovod's ``*_async`` and waited for
``max_staleness`` steps later (horovod_ext/consensus/rounds.py has the schedule): Horovod's background thread
moves the parameters while this rank keeps stepping. ``state_dict()`` waits for what is in flight and saves it
with its due step, so a rank that resumes from its own checkpoint continues bit for bit.
"""
import itertools

import horovod.torch as hvd
import torch

from horovod_ext.compression import CompressionStats
from horovod_ext.compression.consistency import allgather_blobs
from horovod_ext.compression.generation import named, stale_names_reset
from horovod_ext.compression.horovod_args import check_named_parameters
from horovod_ext.consensus import ElasticSync, LeaderSync
from horovod_ext.consensus.agreement import build_on_every_rank
from horovod_ext.consensus.backend import ParameterBackend
from horovod_ext.consensus.leader import ELASTIC_EVALUATION, LEADER_EVALUATION, check_evaluation
from horovod_ext.consensus.state import ParameterState
from horovod_ext.consensus.step import ElasticStep, LeaderStep
from .backend import barrier_over_every_rank, numpy_allgather, timed_into
from .wrapping import StateInCheckpoint, wrap

_ids = itertools.count()


class _Transfer:
    """Collectives in flight (Horovod handles); wait() returns their results, once complete."""

    def __init__(self, handles, values=None, single=False):
        self.handles, self.values, self.single = handles, values, single

    def wait(self):
        if self.values is None:
            self.values = [hvd.synchronize(h) for h in self.handles]
            self.handles = None
        return self.values[0] if self.single else self.values


class TorchParameterState(ParameterState):
    """The optimizer's state in Python (in its state_dict()): the step counter, the loss window and EASGD's
    center."""

    def __init__(self):
        self.step = 0
        self.loss = [0.0, 0]  # sum and count of the losses reported since the last election
        self.center_values = None  # EASGD's center, a list of tensors once initialized

    def advance_step(self):
        self.step += 1
        return self.step

    def loss_window(self):
        return torch.tensor([self.loss], dtype=torch.float64)

    def reset_loss_window(self):
        self.loss = [0.0, 0]

    def center(self):
        return self.center_values

    def center_ready(self):
        return self.center_values is not None

    def set_center(self, values):
        self.center_values = list(values)

    def shared_state_read(self, owner):
        """Nothing to take on: a checkpoint reaches the step only through the optimizer's load_state_dict()."""

    def shared_state_written(self, owner):
        """Nothing to store: the optimizer's state_dict() reads the step's shared state when it is called."""


class TorchParameterBackend(ParameterBackend):
    """Horovod's torch collectives by handle (asynchronous rounds) and the parameters themselves."""

    asynchronous = True

    def __init__(self, params, stats):
        self.params, self.stats = params, stats
        self.nranks, self.rank = hvd.size(), hvd.rank()
        self.sets = {}  # level name -> Horovod process set (LeaderStep's)

    # ----------------------------------------------------------------------------------------------- parameters
    def parameters(self):
        return [p.detach() for p in self.params]

    @torch.no_grad()
    def add_to_parameters(self, forces):
        if forces is not None:
            for p, force in zip(self.params, forces):
                p.add_(force)

    @torch.no_grad()
    def assign_parameters(self, values):
        for p, v in zip(self.params, values):
            p.copy_(v)

    @staticmethod
    def copy(values):
        return [v.detach().clone() for v in values]

    # ---------------------------------------------------------------------------------------------- collectives
    def allgather(self, x, name):
        with stale_names_reset():
            return _Transfer([hvd.allgather_async(x, name=name)], single=True)

    def broadcast(self, values, root, level, name):
        """The root sends a copy, so that its later steps do not change what is in flight."""
        members = range(self.nranks) if level is None else level.members
        rank = members[int(root)]
        where = {} if level is None else {"process_set": self.sets[level.name]}
        with stale_names_reset():
            handles = [hvd.broadcast_async(v.clone() if rank == self.rank else v, root_rank=rank,
                                           name=f"{name}.{i}", **where) for i, v in enumerate(values)]
        return _Transfer(handles)

    def allreduce_mean(self, values, name):
        with stale_names_reset():
            handles = [hvd.allreduce_async_(v, op=hvd.Average, name=f"{name}.{i}") for i, v in enumerate(values)]
        return _Transfer(handles)

    @staticmethod
    def wait(future):
        return future.wait()

    def done(self, value):
        if isinstance(value, list):
            return _Transfer(None, values=[v.to(p.device) for v, p in zip(value, self.params)])
        return _Transfer(None, values=[value], single=True)

    @staticmethod
    def add_process_set(ranks):
        return hvd.add_process_set(ranks)

    @staticmethod
    def barrier():
        barrier_over_every_rank()

    # ------------------------------------------------------------------------------------------ host, control
    @staticmethod
    def host(fn, args, dtypes):
        result = fn(*[a.tolist() if torch.is_tensor(a) else a for a in args])
        return result if isinstance(result, tuple) else (result,)

    @staticmethod
    def cond(truth, true_fn, false_fn):
        return true_fn() if truth else false_fn()

    @staticmethod
    def when(truth, fn, otherwise=None):
        if truth:
            return fn()
        return otherwise() if otherwise is not None else None

    @staticmethod
    def bit(mask, i):
        return bool(int(mask) & (1 << i))

    @staticmethod
    def after(first, fn):
        return fn()

    def timed(self):
        return timed_into(self.stats, "comm_seconds")


class _ParameterSync(StateInCheckpoint):
    """Horovod's API around a consensus step: construction on every rank, report_loss, step(), stats and
    checkpoints. Mixed in before the user's optimizer class, so super() reaches the user's optimizer."""

    def _hx_setup(self, named_parameters, make_sync, arguments, step_class):
        self._hx_id = next(_ids)
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        names = check_named_parameters(named_parameters, params, self._hx_what)
        self._hx_params = params
        self._hx_names = [names.get(id(p), f"param.{i}") for i, p in enumerate(params)]
        self._hx_make = (make_sync, arguments, step_class)
        self._hx_build(CompressionStats(self._hx_what), TorchParameterState())

    def _hx_build(self, stats, state):
        """The step for this job's membership (collective: the arguments are checked on every rank, and groups
        become process sets)."""
        make_sync, arguments, step_class = self._hx_make
        params = self._hx_params
        tensors = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(self._hx_names, params)]
        sync = build_on_every_rank(make_sync, arguments, tensors, self._hx_allgather_blobs, hvd.rank(), hvd.size(),
                                   self._hx_what)
        self._hx_be = TorchParameterBackend(params, stats)
        self._hx_state = state
        self._hx_run = step_class(sync, self._hx_be, state, stats, named(f"hvdext.{self._hx_what}.{self._hx_id}",
                                                                  sync.generation),
                                  sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params))
        self._hx_be.sets = getattr(self._hx_run, "process_sets", {})

    def _hx_forget_in_flight(self):
        """Drop the rounds in flight without waiting (Horovod failed under them, or is being reset)."""
        self._hx_run.forget_in_flight()

    def _hx_elastic_reset(self):
        """After Horovod's elastic reset (horovod_ext.torch.elastic): the step is built again for the new
        membership (collective, on every rank: groups, process sets, EASGD's alpha = beta/p), from this rank's
        state: the step counter, its loss window, the statistics and EASGD's center carry over; the elected
        leaders and the rounds in flight do not (their ranks are gone or renumbered): the next election elects
        again, from the losses reported since."""
        self._hx_run.forget_in_flight()
        self._hx_build(self._hx_be.stats, self._hx_state)

    _hx_sync = property(lambda self: self._hx_run.sync)

    def _hx_allgather_blobs(self, blob):
        return allgather_blobs(blob, numpy_allgather(), f"horovod_ext.{self._hx_what}.{self._hx_id}.settings")

    def report_loss(self, loss):
        """Add this step's training loss (a number or a scalar tensor) to the running average the leader is
        elected by; call it before step(), or pass a closure to step()."""
        self._hx_state.loss[0] += float(loss.detach()) if torch.is_tensor(loss) else float(loss)
        self._hx_state.loss[1] += 1

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            self.report_loss(loss)
        with torch.no_grad():
            self._hx_run.step()
        super().step()
        return loss

    def compression_stats(self):
        """Bytes this rank handed to collectives and bytes on the wire, against what data-parallel SGD's
        allreduce of the gradients would have sent (dense_bytes, dense_wire_bytes), per step and in total."""
        return self._hx_run.compression_stats()

    def _hx_ours(self):
        state, run = self._hx_state, self._hx_run
        return {"step": state.step, "loss": list(state.loss), "sync": run.shared_state(),
                "stats": self._hx_be.stats.state(), "rounds": run.drained_rounds(),
                "center": None if state.center_values is None else [c.clone() for c in state.center_values]}

    def _hx_load_ours(self, ours):
        state, run = self._hx_state, self._hx_run
        state.step = int(ours["step"])
        state.loss = [float(ours["loss"][0]), int(ours["loss"][1])]
        run.load_shared_state(ours["sync"])
        self._hx_be.stats.load_state(ours["stats"])
        run.load_rounds(ours.get("rounds", []))
        center = ours.get("center")
        state.center_values = None if center is None else [c.clone().to(p.device) for c, p in
                                                           zip(center, self._hx_params)]

    def _hx_broadcast_state(self, root_rank):
        """horovod_ext's part of broadcast_optimizer_state: root_rank's schedule (step counter, elected leaders,
        statistics, EASGD's center) on every rank; the running loss since the last election stays each rank's own."""
        ours = hvd.broadcast_object(self._hx_ours(), root_rank=root_rank, name=self._hx_run.name("state"))
        ours["loss"] = list(self._hx_state.loss)
        ours["rounds"] = []  # every rank restarts from root's parameters: nothing in flight survives
        self._hx_load_ours(ours)

    @torch.no_grad()
    def evaluation_parameters(self, which=None):
        """Context manager: inside the block the model holds the parameters of the best worker of the last
        election (LSGD, which="leader"; rank 0 before the first), the workers' average (LSGD, which="center",
        the paper's center variable) or EASGD's center (which="center"), and its own again after it. LSGD's is
        collective: every rank enters it."""
        which = self._hx_run_default if which is None else which
        check_evaluation(which, self._hx_evaluations, self._hx_what)
        return self._hx_run.swapped_in(self._hx_run.evaluation_values(which))


class _Leader(_ParameterSync):
    _hx_what = "LeaderOptimizer"
    _hx_run_default = "leader"
    _hx_evaluations = LEADER_EVALUATION


class _Elastic(_ParameterSync):
    _hx_what = "ElasticAveragingOptimizer"
    _hx_run_default = "center"
    _hx_evaluations = ELASTIC_EVALUATION


def LeaderOptimizer(optimizer, named_parameters=None, pull=0.1, global_pull=0.1, period=4, global_period=16,
                    groups="node", asynchronous=False, max_staleness=None):
    """Leader SGD (LSGD, Teng et al. 2019) over Horovod: wrap a torch optimizer.

    Every rank steps on its own gradient (no gradient averaging). Every ``period`` steps the ranks elect leaders
    (lowest running-average training loss since the last election, ties to the lowest rank) and each rank is
    pulled toward its group's leader with weight ``pull``; every ``global_period`` steps (a multiple of
    ``period``) also toward the global leader with ``global_pull``:
    x <- x - lr*g - pull*(x - x_group_leader) - global_pull*(x - x_global_leader).

    groups: "node" (one group per host: Horovod's local ranks), explicit rank lists such as [[0, 1], [2, 3]],
    or None for single-leader LSGD (all ranks follow one leader every ``period`` steps with ``pull``;
    ``global_pull`` and ``global_period`` unused). Groups are Horovod process sets, made here; initialize with
    ``horovod_ext.torch.init()``, which enables Horovod's dynamic process sets. pull = global_pull = 0 is
    independent SGD. The training loss comes from ``step(closure)`` or ``report_loss(loss)`` before ``step()``.
    Construction is collective: bad or differing arguments raise the same error on every rank.

    asynchronous=True hides the communication behind local steps: the losses exchanged at an election step s are
    read at s + 1, where the leaders' broadcasts start, and the pull is applied at s + 1 + max_staleness with the
    leaders' parameters of step s + 1 and the force taken at the step it is applied:
    x_a <- x_a - lr*g_a - pull*(x_a - x_L[s+1]) - global_pull*(x_a - x_G[s+1]); a rank takes no pull toward
    itself. max_staleness (default period - 1, at least 1) bounds the lag: a transfer not complete by then is
    waited for. Every rank applies the same schedule; max_staleness=0 is the synchronous optimizer.
    """
    arguments = LeaderSync.arguments(pull, global_pull, period, global_period, groups, asynchronous, max_staleness)
    wrapped = wrap(_Leader, optimizer)
    wrapped._hx_setup(named_parameters, lambda: LeaderSync(size=hvd.size(), **arguments), arguments, LeaderStep)
    return wrapped


def ElasticAveragingOptimizer(optimizer, named_parameters=None, beta=0.9, period=4, asynchronous=False,
                              max_staleness=None):
    """Synchronous Elastic Averaging SGD (EASGD, Zhang et al. 2015) over Horovod: wrap a torch optimizer.

    Every rank steps on its own gradient; every ``period`` steps one allreduce gives the workers' mean and
    center <- (1-beta)*center + beta*mean, x_i <- x_i - (beta/p)*(x_i - center_old). The center starts at the
    workers' parameters at the first step; evaluate and save it with ``evaluation_parameters()``.

    asynchronous=True: the allreduce of x_s starts at step s and is applied at a = s + max_staleness (default
    period - 1, at least 1): center <- (1-beta)*center + beta*mean(x[s]), x_a <- x_a - (beta/p)*(x_a - center_old).
    """
    arguments = ElasticSync.arguments(beta, period, asynchronous, max_staleness)
    wrapped = wrap(_Elastic, optimizer)
    wrapped._hx_setup(named_parameters, lambda: ElasticSync(size=hvd.size(), **arguments), arguments, ElasticStep)
    return wrapped
