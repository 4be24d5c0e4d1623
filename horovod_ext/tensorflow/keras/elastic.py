"""hvd.elastic for Keras 3: Horovod's elastic Keras API (``KerasState``, ``CommitStateCallback``,
``UpdateBatchStateCallback``, ``UpdateEpochStateCallback``, ``run``; Horovod's names and arguments), for Keras 3
models and horovod_ext's DistributedOptimizer, LeaderOptimizer and ElasticAveragingOptimizer. Horovod 0.28.1's own
targets the Keras 2 optimizer API (``optimizer.variables()``, which Keras 3 made a list), and knows nothing of
horovod_ext's state.

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
step, which Keras traces again. LeaderOptimizer / ElasticAveragingOptimizer: the step counter, the statistics and
EASGD's center come from rank 0 (an added rank receives the center), the loss window stays each rank's own, and
the groups, their process sets and EASGD's alpha are built again for the new membership; the elected leaders are
not kept. Each optimizer's part is in its ``horovod_ext`` object (tensorflow/elastic_state.py).
"""
import keras
import tensorflow as tf
from horovod._keras import elastic as _impl
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError
from horovod.tensorflow.functions import broadcast_object
from horovod.tensorflow.mpi_ops import rank, shutdown

from horovod_ext.consensus.init import reinitialize
from horovod_ext.tensorflow.elastic_state import assign_all, broadcast_variables, numpy_values


def _ours(optimizer):
    """horovod_ext's state of the optimizer (tensorflow/elastic_state.py), or None for a Keras optimizer."""
    return getattr(optimizer, "horovod_ext", None)


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
        broadcast_variables(self.model.variables, "model")
        broadcast_variables(self.optimizer.variables, "optimizer")
        ours = _ours(self.optimizer)
        if ours is not None:
            ours.elastic_sync()
        self._save_model()
        super().sync()

    def on_reset(self):
        ours = _ours(self.optimizer)
        if ours is not None:
            ours.elastic_reset()
        self.model.train_function = None  # traced for the old membership: fit() traces it again
        super().on_reset()

    def _save_model(self):
        self._saved_model = numpy_values(self.model.variables)
        self._saved_optimizer = numpy_values(self.optimizer.variables)
        ours = _ours(self.optimizer)
        self._saved_ours = None if ours is None else ours.elastic_commit()

    def _load_model(self):
        assign_all(self.model.variables, self._saved_model)
        assign_all(self.optimizer.variables, self._saved_optimizer)
        ours = _ours(self.optimizer)
        if ours is not None and self._saved_ours is not None:
            ours.elastic_restore(self._saved_ours)


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
