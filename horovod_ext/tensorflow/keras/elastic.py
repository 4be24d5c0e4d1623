"""hvd.elastic for Keras 3: Horovod's elastic Keras API (``KerasState``, ``CommitStateCallback``,
``UpdateBatchStateCallback``, ``UpdateEpochStateCallback``, ``run``; Horovod's names and arguments), for Keras 3
models and horovod_ext's DistributedOptimizer. Horovod 0.28.1's own targets the Keras 2 optimizer API
(``optimizer.variables()``, which Keras 3 made a list), and knows nothing of horovod_ext's state.

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.CommitStateCallback(state, batches_per_commit=10),
                 hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state)]

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, steps_per_epoch=..., epochs=epochs - state.epoch, callbacks=callbacks)

    train(state)

The state commits the model's and the optimizer's variables and, for horovod_ext's DistributedOptimizer, the
aggregator's: the step counter, the seed and the method's shared state (GraVAC's controller, sparse_reduce's
regions), and this rank's error-feedback residuals. After a reset the model, the optimizer and the shared part
come from rank 0; the residuals stay each survivor's own (an added rank starts from zero; a departed rank's are
lost: at most one step's unsent gradient mass), and the compressor is built again for the new N at the next
step, which Keras traces again.
"""
import keras
import tensorflow as tf
from horovod._keras import elastic as _impl
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError
from horovod.tensorflow.functions import broadcast_object
from horovod.tensorflow.mpi_ops import broadcast, rank, shutdown

from horovod_ext.consensus.init import reinitialize


def _aggregator(optimizer):
    return getattr(optimizer, "horovod_ext", None)


def _broadcast_variables(variables, tag):
    for i, v in enumerate(variables):
        v.assign(broadcast(tf.convert_to_tensor(v), 0, name=f"hvdext.elastic.{tag}.{i}", ignore_name_scope=True))


class KerasState(ObjectState):
    """Horovod's KerasState(model, optimizer=None, **kwargs) for Keras 3: the model must be built; the optimizer
    is the model's unless given, and is built here (its variables must exist on every rank before a sync)."""

    def __init__(self, model, optimizer=None, **kwargs):
        if not model.built:
            raise ValueError("KerasState: the model must be built first (model.build(input_shape), or call it on "
                             "a batch)")
        self.model = model
        self.optimizer = optimizer or model.optimizer
        if self.optimizer is None:
            raise ValueError("KerasState: compile the model with an optimizer, or pass optimizer=")
        ours = _aggregator(self.optimizer)
        if ours is not None and not hasattr(ours, "elastic_reset"):
            raise NotImplementedError(
                f"KerasState: horovod_ext's Keras {type(ours).__name__.strip('_')} of a LeaderOptimizer or "
                f"ElasticAveragingOptimizer is not supported in elastic mode (its groups, process sets and schedule "
                f"are not rebuilt after a reset); elastic mode supports Keras's DistributedOptimizer with every "
                f"compressor, and horovod_ext.torch's LeaderOptimizer and ElasticAveragingOptimizer")
        self._build_optimizer()
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _build_optimizer(self):
        if not self.optimizer.built:
            self.optimizer.build(self.model.trainable_variables)

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        self._load_model()
        super().restore()

    def sync(self):
        self._build_optimizer()
        _broadcast_variables(self.model.variables, "model")
        _broadcast_variables(self.optimizer.variables, "optimizer")
        aggregator = _aggregator(self.optimizer)
        if aggregator is not None:
            _broadcast_variables(aggregator.shared_variables(), "horovod_ext")
            aggregator.method_state.assign(broadcast_object(aggregator.method_state.numpy().decode(),
                                                            name="hvdext.elastic.method_state"))
        self._save_model()
        super().sync()

    def on_reset(self):
        aggregator = _aggregator(self.optimizer)
        if aggregator is not None:
            aggregator.elastic_reset()
        self.model.train_function = None  # traced for the old membership: fit() traces it again
        super().on_reset()

    def _save_model(self):
        self._saved_model = [v.numpy() for v in self.model.variables]
        self._saved_optimizer = [v.numpy() for v in self.optimizer.variables]
        aggregator = _aggregator(self.optimizer)
        self._saved_ours = None if aggregator is None else {
            "shared": [v.numpy() for v in aggregator.shared_variables()],
            "method_state": aggregator.method_state.numpy(),
            "residuals": {name: v.numpy() for name, v in aggregator.residuals.items()}}

    def _load_model(self):
        for v, value in zip(self.model.variables, self._saved_model):
            v.assign(value)
        for v, value in zip(self.optimizer.variables, self._saved_optimizer):
            v.assign(value)
        aggregator = _aggregator(self.optimizer)
        if aggregator is not None and self._saved_ours is not None:
            for v, value in zip(aggregator.shared_variables(), self._saved_ours["shared"]):
                v.assign(value)
            aggregator.method_state.assign(self._saved_ours["method_state"])
            for name, value in self._saved_ours["residuals"].items():
                if name in aggregator.residuals:
                    aggregator.residuals[name].assign(value)


class CommitStateCallback(_impl.CommitStateCallbackImpl, keras.callbacks.Callback):
    """Commit the state every ``batches_per_commit`` batches (default 1) and at the end of every epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__(None, state, batches_per_commit)


class UpdateBatchStateCallback(_impl.UpdateBatchStateCallbackImpl, keras.callbacks.Callback):
    """``state.batch`` follows the batch number (0 at the end of an epoch); with ``steps_per_epoch``, the epoch
    after a reset is shortened by the batches already done."""

    def __init__(self, state):
        super().__init__(None, state)


class UpdateEpochStateCallback(_impl.UpdateEpochStateCallbackImpl, keras.callbacks.Callback):
    """``state.epoch`` counts the epochs done across resets."""

    def __init__(self, state):
        super().__init__(None, state)


def _horovod_failure(error):
    """A TensorFlow error raised because a Horovod collective failed (a peer died): the op names Horovod."""
    return isinstance(error, (tf.errors.UnknownError, tf.errors.InternalError, tf.errors.AbortedError,
                              tf.errors.FailedPreconditionError, tf.errors.UnavailableError)) \
        and "horovod" in str(error).lower()


def run(func):
    """Horovod's elastic run for TensorFlow: a failed Horovod collective inside a step (a TensorFlow error naming
    Horovod) becomes HorovodInternalError, which restores the last commit; the reset initializes Horovod again
    as the script's first init did."""
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as error:
            if _horovod_failure(error):
                raise HorovodInternalError(error) from error
            raise

    return run_fn(wrapper, _reset)


def _reset():
    from horovod_ext.tensorflow.keras import init  # the package imports this module
    reinitialize(shutdown, init)


__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
