"""hvd.elastic for horovod_ext: Horovod's elastic training (``run``, ``TorchState``, ``ElasticSampler``, the same
names and signatures as ``horovod.torch.elastic``) with horovod_ext's optimizers in the state.

    import horovod_ext.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.topk(ratio=0.01))
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...; optimizer.step(); state.batch += 1; state.commit()

    train(state)          # horovodrun -np 4 --min-np 2 --max-np 8 --host-discovery-script discover.sh ...

What a reset does (Horovod's run loop: a failed collective restores the last commit on every survivor; a host
added or removed interrupts at the next commit; then Horovod is shut down and initialized again and the state is
synchronized from rank 0):

- ``restore()``: a horovod_ext optimizer first drops its collectives in flight without waiting (their handles died
  with the failed ring), then loads the committed state_dict, its own: every survivor gets back its own
  error-feedback residuals as they were at the commit, whatever rank number it has next.
- ``on_reset()`` (after Horovod's init, before ``sync()`` and the user's reset callbacks): the optimizer rebuilds
  everything sized by N for the new membership (DistributedOptimizer: at its next step, from a settings exchange
  made as at start; LeaderOptimizer / ElasticAveragingOptimizer / DiLoCoOptimizer: at once, collectively; DiLoCo's outer
  parameters, momentum and inner step count come back from the commit, then from rank 0 at ``sync()``).
- ``sync()``: the model's parameters and the optimizer state from rank 0, with horovod_ext's broadcast_optimizer_state
  (the shared part: step counter, seed, statistics, GraVAC's controller, sparse_reduce's regions, the schedule).

Per-rank state across a reset: a survivor keeps its residuals (from the commit after a failure; a host update
interrupts at a commit, where they are the commit's); a departed rank's residuals are lost (at most one step's
unsent gradient mass of that rank); an added rank starts from zero residuals. Steps rolled back to the last commit
are redone: the statistics and GraVAC's table are the commit's, so a redone step is counted once.

The reset initializes Horovod as the script's first ``init`` did: with horovod_ext's, dynamic process sets stay on, so
that LeaderOptimizer's groups are made again as process sets of the new membership; a script initialized by
Horovod's own init (the launcher's case) keeps them off, as a rank that joins then starts.
"""
import copy

from horovod.common.elastic import run_fn
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.elastic.state import StateHandler, TorchState as _HorovodTorchState
from horovod.torch.mpi_ops import shutdown

from horovod_ext.consensus.init import reinitialize
from .functions import broadcast_optimizer_state


class OptimizerStateHandler(StateHandler):
    """A horovod_ext optimizer in the state: commit its state_dict (with this rank's residuals), restore it after
    dropping what is in flight, rebuild it for the new membership, and synchronize it with horovod_ext's
    broadcast_optimizer_state."""

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.save()

    def save(self):
        self._saved_optimizer_state = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value._hx_forget_in_flight()
        # a copy: torch's load_state_dict may keep the given tensors (momentum buffers), which the next steps
        # would then change under the commit
        self.value.load_state_dict(copy.deepcopy(self._saved_optimizer_state))

    def on_reset(self):
        self.value._hx_elastic_reset()

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


def is_horovod_ext_optimizer(value):
    return hasattr(value, "_hx_elastic_reset")


class TorchState(_HorovodTorchState):
    """horovod.torch.elastic.TorchState (the same arguments), with horovod_ext's optimizers handled as the module
    docstring says; models, samplers, Horovod's own optimizers and plain values as Horovod handles them."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        super().__init__(model=model, optimizer=optimizer, **kwargs)
        for name, handler in list(self._handlers.items()):
            if is_horovod_ext_optimizer(handler.value):
                self._handlers[name] = OptimizerStateHandler(handler.value)

    def on_reset(self):
        for handler in self._handlers.values():
            if isinstance(handler, OptimizerStateHandler):
                handler.on_reset()
        super().on_reset()


def run(func):
    """horovod.torch.elastic.run: run ``func(state, ...)`` across resets; see Horovod's documentation. The reset
    initializes Horovod again with horovod_ext's init (dynamic process sets on)."""
    return run_fn(func, _reset)


def _reset():
    from horovod_ext.torch import init  # the package imports this module
    reinitialize(shutdown, init)


__all__ = ["TorchState", "ElasticSampler", "run"]
