"""LeaderOptimizer's and ElasticAveragingOptimizer's PyTorch side, for both PyTorch adapters, with no Horovod
import: the optimizer's state (TorchParameterState), the backend contract's parameter access and control flow
(TorchParameterBackend; an adapter adds the collectives), and the optimizer's API around consensus/step.py's step
(ParameterSync), over an adapter's collectives (collectives.py: Horovod's, or torch.distributed's)."""
import torch

from horovod_ext.compression import CompressionStats
from horovod_ext.compression.consistency import allgather_blobs
from horovod_ext.compression.generation import named
from horovod_ext.consensus.agreement import build_on_every_rank
from horovod_ext.consensus.backend import ParameterBackend
from horovod_ext.consensus import ElasticSync, LeaderSync
from horovod_ext.consensus.leader import ELASTIC_EVALUATION, LEADER_EVALUATION, check_evaluation
from horovod_ext.consensus.state import ParameterState
from horovod_ext.consensus.step import ElasticStep, LeaderStep
from .tensors import timed_into
from .wrapping import StateInCheckpoint, trainable, wrap


class Transfer:
    """Collectives in flight: wait() returns their results (each waiter's), once complete."""

    def __init__(self, waiters, values=None, single=False):
        self.waiters, self.values, self.single = waiters, values, single

    def wait(self):
        if self.values is None:
            self.values = [wait() for wait in self.waiters]
            self.waiters = None
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
    """The parameters themselves, and eager control flow; a subclass adds the collectives (allgather, broadcast,
    allreduce_mean, add_process_set, barrier), returning Transfers."""

    asynchronous = True

    def __init__(self, params, stats):
        self.params, self.stats = params, stats
        self.sets = {}  # level name -> process set or group (LeaderStep's)

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

    @staticmethod
    def wait(future):
        return future.wait()

    def done(self, value):
        if isinstance(value, list):
            return Transfer(None, values=[v.to(p.device) for v, p in zip(value, self.params)])
        return Transfer(None, values=[value], single=True)

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


class ParameterSync(StateInCheckpoint):
    """The optimizer's API around a consensus step: construction on every rank, report_loss, step(), stats and
    checkpoints, over the adapter's collectives (self._hx_comm). Mixed in before the user's optimizer class, so
    super() reaches the user's optimizer."""

    def _hx_setup(self, named_parameters, make_sync, arguments, step_class):
        trainable(self, named_parameters)
        self._hx_make = (make_sync, arguments, step_class)
        self._hx_build(CompressionStats(self._hx_what), TorchParameterState())

    def _hx_build(self, stats, state):
        """The step for this job's membership (collective: the arguments are checked on every rank, and groups
        become the adapter's groups)."""
        make_sync, arguments, step_class = self._hx_make
        params, comm = self._hx_params, self._hx_comm
        tensors = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(self._hx_names, params)]
        blobs = lambda blob: allgather_blobs(  # noqa: E731
            blob, comm.numpy_allgather(None), f"horovod_ext.{self._hx_what}.{self._hx_id}.settings")
        sync = build_on_every_rank(make_sync, arguments, tensors, blobs, comm.rank, comm.size, self._hx_what)
        self._hx_be = comm.parameter_backend(params, stats)
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
        ours = self._hx_comm.broadcast_object(self._hx_ours(), root_rank, self._hx_run.name("state"))
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


class LeaderSyncOptimizer(ParameterSync):
    """LSGD's ParameterSync."""

    _hx_what = "LeaderOptimizer"
    _hx_run_default = "leader"
    _hx_evaluations = LEADER_EVALUATION
    _hx_sync_class, _hx_step_class = LeaderSync, LeaderStep


class ElasticSyncOptimizer(ParameterSync):
    """EASGD's ParameterSync."""

    _hx_what = "ElasticAveragingOptimizer"
    _hx_run_default = "center"
    _hx_evaluations = ELASTIC_EVALUATION
    _hx_sync_class, _hx_step_class = ElasticSync, ElasticStep


def sync_optimizer(mixin, collectives, optimizer, named_parameters, **kwargs):
    """`optimizer` wrapped by `mixin` (LeaderSyncOptimizer or ElasticSyncOptimizer) over an adapter's
    `collectives`, the method's arguments checked on every rank."""
    sync_class = mixin._hx_sync_class
    arguments = sync_class.arguments(**kwargs)
    wrapped = wrap(mixin, optimizer, collectives)
    wrapped._hx_setup(named_parameters, lambda: sync_class(size=collectives.size, **arguments), arguments,
                      mixin._hx_step_class)
    return wrapped
