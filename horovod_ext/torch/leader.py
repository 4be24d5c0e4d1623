"""LeaderOptimizer (LSGD, multi-leader LSGD) and ElasticAveragingOptimizer (EASGD) for PyTorch.

Both replace gradient averaging: every rank steps its own optimizer on its own gradient, and every `period` steps
the parameters are pulled toward a leader's (LSGD) or a center's (EASGD). The schedule, groups, election and the
settings check are horovod_ext.consensus's; this module moves tensors.

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
import contextlib
import itertools
import time

import horovod.torch as hvd
import torch

from horovod_ext.compression import CompressionStats
from horovod_ext.compression.consistency import allgather_blobs
from horovod_ext.compression.horovod_args import check_named_parameters
from horovod_ext.consensus import ElasticSync, LeaderSync, Rounds
from horovod_ext.consensus.accounting import account_dense_reference
from horovod_ext.consensus.agreement import build_on_every_rank, level_process_sets
from horovod_ext.consensus.leader import ELASTIC_EVALUATION, LEADER_EVALUATION, check_evaluation
from horovod_ext.consensus.rounds import Round
from .backend import numpy_allgather

STATE_KEY = "horovod_ext"
_ids = itertools.count()


class _Transfer:
    """Collectives in flight (Horovod handles); wait() returns their results, once complete.

    delay: injected latency in seconds (tests slow a collective with it): the results are not handed out before
    `delay` seconds after the start, as if the link had held them that long."""

    def __init__(self, handles, delay=0.0, values=None):
        self.handles, self.ready_at, self.values = handles, time.perf_counter() + delay, values

    @classmethod
    def done(cls, values):
        return cls(None, values=list(values))

    def wait(self):
        if self.values is None:
            pause = self.ready_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            self.values = [hvd.synchronize(h) for h in self.handles]
            self.handles = None
        return self.values


class _ParameterSync:
    """What both optimizers share: construction on every rank, the loss window, step(), stats and checkpoints.
    Mixed in before the user's optimizer class, so super() reaches the user's optimizer."""

    def _hx_setup(self, named_parameters, make_sync, arguments):
        self._hx_id = next(_ids)
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        names = check_named_parameters(named_parameters, params, self._hx_what)
        self._hx_params = params
        self._hx_names = [names.get(id(p), f"param.{i}") for i, p in enumerate(params)]
        tensors = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(self._hx_names, params)]
        self._hx_sync = build_on_every_rank(make_sync, arguments, tensors, self._hx_allgather_blobs, hvd.rank(),
                                            hvd.size(), self._hx_what)
        self._hx_step = 0
        self._hx_loss = [0.0, 0]  # sum and count of the losses reported since the last election
        sync = self._hx_sync
        self._hx_rounds = Rounds(sync.staleness, sync.period, lag=self._hx_election_lag)
        self._hx_transfer_delay = 0.0  # seconds of injected latency on parameter transfers (tests)
        self._hx_param_bytes = sum(p.numel() * p.element_size() for p in params)
        self._hx_stats = CompressionStats(self._hx_what)

    def _hx_allgather_blobs(self, blob):
        return allgather_blobs(blob, numpy_allgather(), f"horovod_ext.{self._hx_what}.{self._hx_id}.settings")

    def _hx_tag(self, *parts):
        return ".".join(["hvdext", self._hx_what, str(self._hx_id), *map(str, parts)])

    def report_loss(self, loss):
        """Add this step's training loss (a number or a scalar tensor) to the running average the leader is
        elected by; call it before step(), or pass a closure to step()."""
        self._hx_loss[0] += float(loss.detach()) if torch.is_tensor(loss) else float(loss)
        self._hx_loss[1] += 1

    @torch.no_grad()
    def _hx_communicate(self, step):
        raise NotImplementedError

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            self.report_loss(loss)
        self._hx_step += 1
        start = time.perf_counter()
        self._hx_communicate(self._hx_step)
        self._hx_stats.add(comm_seconds=time.perf_counter() - start)
        account_dense_reference(self._hx_stats, sum(p.numel() for p in self._hx_params), self._hx_param_bytes,
                                hvd.size())
        self._hx_stats.end_step()
        super().step()
        return loss

    def compression_stats(self):
        """Bytes this rank handed to collectives and bytes on the wire, against what data-parallel SGD's
        allreduce of the gradients would have sent (dense_bytes, dense_wire_bytes), per step and in total."""
        stats = self._hx_stats.as_dict()
        stats.update(ranks=hvd.size(), optimizer=self._hx_what, staleness=self._hx_sync.staleness,
                     rounds_in_flight=len(self._hx_rounds.pending), **self._hx_sync.state())
        return stats

    def _hx_state(self):
        return {}

    def _hx_load(self, state):
        pass

    def _hx_ours(self):
        return {"step": self._hx_step, "loss": list(self._hx_loss), "sync": self._hx_sync.state(),
                "stats": self._hx_stats.state(), "rounds": self._hx_drained_rounds(), **self._hx_state()}

    def _hx_load_ours(self, ours):
        self._hx_step = int(ours["step"])
        self._hx_loss = [float(ours["loss"][0]), int(ours["loss"][1])]
        self._hx_sync.load_state(ours["sync"])
        self._hx_stats.load_state(ours["stats"])
        self._hx_load_rounds(ours.get("rounds", []))
        self._hx_load(ours)

    def _hx_drained_rounds(self):
        """The rounds in flight, each transfer waited for (no new collective is started, so this is safe on one
        rank alone): [{step, due levels, election and pull steps, slot, gathered windows, leaders, values}]."""
        out = []
        for r in self._hx_rounds.pending:
            exchange = r.exchange.wait()[0].clone() if r.exchange is not None else None
            values = None if r.transfers is None else {name: [v.clone() for v in t.wait()]
                                                        for name, t in r.transfers.items()}
            out.append({"step": r.step, "due": None if r.due is None else [level.name for level in r.due],
                        "elect_at": r.elect_at, "apply_at": r.apply_at, "slot": r.slot, "exchange": exchange,
                        "leaders": r.leaders, "values": values})
        return out

    def _hx_load_rounds(self, saved):
        levels = {level.name: level for level in getattr(self._hx_sync, "levels", [])}
        self._hx_rounds.clear()
        for d in saved:
            r = Round(int(d["step"]), None if d["due"] is None else [levels[n] for n in d["due"]], int(d["elect_at"]),
                      int(d["apply_at"]), int(d["slot"]))
            r.exchange = None if d["exchange"] is None else _Transfer.done([d["exchange"].clone()])
            r.leaders = None if d["leaders"] is None else {k: int(v) for k, v in d["leaders"].items()}
            r.transfers = None if d["values"] is None else {
                name: _Transfer.done([v.clone().to(p.device) for v, p in zip(values, self._hx_params)])
                for name, values in d["values"].items()}
            self._hx_rounds.pending.append(r)

    def state_dict(self):
        state = super().state_dict()
        state[STATE_KEY] = self._hx_ours()
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        ours = state_dict.pop(STATE_KEY, None)
        super().load_state_dict(state_dict)
        if ours is not None:
            self._hx_load_ours(ours)

    def _hx_base_step(self, closure=None):
        """The wrapped optimizer's own step, without any collective (Horovod's state-creating step)."""
        return super(_ParameterSync, self).step(closure)

    def _hx_broadcast_state(self, root_rank):
        """horovod_ext's part of broadcast_optimizer_state: root_rank's schedule (step counter, elected leaders,
        statistics, EASGD's center) on every rank; the running loss since the last election stays each rank's own."""
        ours = hvd.broadcast_object(self._hx_ours(), root_rank=root_rank, name=self._hx_tag("state"))
        ours["loss"] = list(self._hx_loss)
        ours["rounds"] = []  # every rank restarts from root's parameters: nothing in flight survives
        self._hx_load_ours(ours)

    @contextlib.contextmanager
    def _hx_swapped_in(self, values):
        saved = [p.detach().clone() for p in self._hx_params]
        with torch.no_grad():
            for p, v in zip(self._hx_params, values):
                p.copy_(v)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, v in zip(self._hx_params, saved):
                    p.copy_(v)


class _Leader(_ParameterSync):
    _hx_what = "LeaderOptimizer"
    _hx_election_lag = 1  # asynchronous: the loss exchange started at an election step is read one step later

    def _hx_make_process_sets(self):
        self._hx_sets = level_process_sets(self._hx_sync, hvd.size(), hvd.add_process_set)

    def _hx_broadcast(self, root, level_name, slot):
        """Start the broadcast of root's parameters as they are now (root sends a copy, so that its later steps
        do not change what is in flight)."""
        ps, mine = self._hx_sets[level_name], hvd.rank() == root
        handles = [hvd.broadcast_async(p.detach().clone() if mine else p.detach(), root_rank=root,
                                       name=self._hx_tag(level_name, slot, i), process_set=ps)
                   for i, p in enumerate(self._hx_params)]
        return _Transfer(handles, self._hx_transfer_delay)

    @torch.no_grad()
    def _hx_communicate(self, step):
        sync, rounds = self._hx_sync, self._hx_rounds
        due = sync.due(step)
        if due:  # start the round: the loss exchange
            started = rounds.start(step, due)
            window = torch.tensor([self._hx_loss], dtype=torch.float64)
            self._hx_loss = [0.0, 0]
            started.exchange = _Transfer([hvd.allgather_async(window, name=self._hx_tag("losses", started.slot))])
            sync.account(self._hx_stats, due, self._hx_param_bytes, hvd.size())
        for r in rounds.electing(step):  # elect, start the leaders' broadcasts
            r.leaders = sync.elect(r.exchange.wait()[0].tolist(), r.step)
            r.transfers = {name: self._hx_broadcast(r.leaders[name], name, r.slot)
                           for name, source in sync.transfer_levels(r.due).items() if source.name == name}
        for r in rounds.applying(step):
            self._hx_pull(r)

    def _hx_pull(self, r):
        """x += sum_k w_k (x_k - x) over the round's levels whose leader is another rank, every force from the
        same x (the parameters now) and summed before it is added."""
        values = {name: t.wait() for name, t in r.transfers.items()}
        sources = self._hx_sync.transfer_levels(r.due)
        targets = [(level.weight, values[sources[level.name].name]) for level in r.due
                   if level.name in sources and r.leaders[level.name] != hvd.rank()]
        for i, p in enumerate(self._hx_params):
            force = None
            for weight, target in targets:
                term = (target[i] - p).mul_(weight)
                force = term if force is None else force.add_(term)
            if force is not None:
                p.add_(force)

    def evaluation_parameters(self, which="leader"):
        """Context manager: inside the block the model holds the parameters of the best worker of the last
        election (which="leader"; rank 0 before the first) or the workers' average (which="center", the
        paper's center variable), and its own again after it. Collective: every rank enters it."""
        check_evaluation(which, LEADER_EVALUATION, self._hx_what)
        if which == "center":
            handles = [hvd.allreduce_async(p.detach(), op=hvd.Average, name=self._hx_tag("evaluate_center", i))
                       for i, p in enumerate(self._hx_params)]
        else:
            handles = [hvd.broadcast_async(p.detach(), root_rank=self._hx_sync.best_rank,
                                           name=self._hx_tag("evaluate", i)) for i, p in enumerate(self._hx_params)]
        return self._hx_swapped_in([hvd.synchronize(h) for h in handles])


class _Elastic(_ParameterSync):
    _hx_what = "ElasticAveragingOptimizer"
    _hx_election_lag = 0

    def _hx_mean_async(self, label, delay=0.0):
        """Start the allreduce of the workers' mean of the parameters as they are now (of a copy, which the
        allreduce averages in place while this rank keeps stepping)."""
        handles = [hvd.allreduce_async_(p.detach().clone(), op=hvd.Average, name=self._hx_tag(label, i))
                   for i, p in enumerate(self._hx_params)]
        self._hx_sync.account(self._hx_stats, self._hx_param_bytes, hvd.size())
        return _Transfer(handles, delay)

    def _hx_ensure_center(self):
        if self._hx_center is None:  # the workers' common start (their mean, should they differ)
            self._hx_center = self._hx_mean_async("center").wait()

    @torch.no_grad()
    def _hx_communicate(self, step):
        self._hx_ensure_center()
        sync, rounds = self._hx_sync, self._hx_rounds
        if sync.due(step):
            started = rounds.start(step, None)
            started.transfers = {"mean": self._hx_mean_async(f"round.{started.slot}", self._hx_transfer_delay)}
        for r in rounds.applying(step):
            means = r.transfers["mean"].wait()
            for p, center, mean in zip(self._hx_params, self._hx_center, means):
                force = (center - p).mul_(sync.alpha)            # from the center before the round
                center.mul_(1.0 - sync.beta).add_(mean.mul_(sync.beta))
                p.add_(force)

    @torch.no_grad()
    def evaluation_parameters(self, which="center"):
        """Context manager: the model holds EASGD's center inside the block (no communication once training
        started; every rank holds the same center)."""
        check_evaluation(which, ELASTIC_EVALUATION, self._hx_what)
        self._hx_ensure_center()
        return self._hx_swapped_in(self._hx_center)

    def _hx_state(self):
        return {"center": None if self._hx_center is None else [c.clone() for c in self._hx_center]}

    def _hx_load(self, state):
        center = state.get("center")
        self._hx_center = None if center is None else [c.clone().to(p.device) for c, p in
                                                       zip(center, self._hx_params)]


def _wrap(mixin, optimizer):
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"{mixin._hx_what} wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    cls = type(optimizer.__class__.__name__, (mixin, optimizer.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)  # the same param_groups and state as the optimizer given
    return wrapped


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
    wrapped = _wrap(_Leader, optimizer)
    arguments = {"pull": pull, "global_pull": global_pull, "period": period, "global_period": global_period,
                 "groups": groups, "asynchronous": asynchronous, "max_staleness": max_staleness}
    wrapped._hx_setup(named_parameters, lambda: LeaderSync(size=hvd.size(), **arguments), arguments)
    wrapped._hx_make_process_sets()
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
    wrapped = _wrap(_Elastic, optimizer)
    wrapped._hx_center = None
    arguments = {"beta": beta, "period": period, "asynchronous": asynchronous, "max_staleness": max_staleness}
    wrapped._hx_setup(named_parameters, lambda: ElasticSync(size=hvd.size(), **arguments), arguments)
    return wrapped
