"""Horovod's Keras callbacks, for Keras 3 models and optimizers."""
import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast the model's variables from root_rank when training starts, and the optimizer's once it has built
    them (after the first batch), so every rank starts from the same state."""

    def __init__(self, root_rank=0, device="", local_variables=None, process_set=hvd.global_process_set):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.local_ids = {id(v) for v in (local_variables or [])}  # Horovod's: variables that stay per rank
        self.process_set = process_set
        self._optimizer_done = False

    def _broadcast(self, variables, tag):
        with tf.device(self.device):
            for i, v in enumerate(variables):
                if id(v) in self.local_ids:
                    continue
                value = hvd.broadcast(tf.convert_to_tensor(v), self.root_rank, name=f"hvdext.bcast.{tag}.{i}",
                                      ignore_name_scope=True, process_set=self.process_set)
                v.assign(value)

    def on_train_begin(self, logs=None):
        self._broadcast(self.model.variables, "model")

    def on_train_batch_end(self, batch, logs=None):
        if not self._optimizer_done and self.model.optimizer is not None and self.model.optimizer.built:
            self._broadcast(self.model.optimizer.variables, "optimizer")
            self._optimizer_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replace each metric in `logs` by its average over ranks (list it before
    callbacks that read metrics, such as ModelCheckpoint or ReduceLROnPlateau)."""

    def __init__(self, device="", process_set=hvd.global_process_set):
        super().__init__()
        self.device = device
        self.process_set = process_set

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        with tf.device(self.device):
            values = tf.constant([float(logs[k]) for k in keys], dtype=tf.float64)
        averaged = hvd.allreduce(values, op=hvd.Average, name=f"hvdext.metrics.{epoch}", ignore_name_scope=True,
                                 process_set=self.process_set).numpy()
        for k, v in zip(keys, averaged):
            logs[k] = float(v)


MOMENTUM_CORRECTION = """``momentum_correction`` (Horovod: scale the momentum by new_lr / old_lr for the batch where the
    learning rate changes) is accepted and has no effect: a Keras 3 optimizer's momentum is a Python constant of the
    compiled train step, not a variable a callback can change."""


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Horovod's: from ``start_epoch`` to ``end_epoch`` (exclusive) the learning rate is
    ``initial_lr * multiplier(epoch)`` (a constant multiplier m means m ** (epoch - start_epoch)), set at each epoch's
    start (``staircase=True``) or at every batch with a fractional epoch = epoch + batch / steps_per_epoch.
    """ + MOMENTUM_CORRECTION

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None or not initial_lr > 0:
            raise ValueError(f"initial_lr must be > 0, got {initial_lr!r}")
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda e: multiplier ** (e - start_epoch))
        self.start_epoch, self.end_epoch, self.staircase = start_epoch, end_epoch, staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def _active(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch):
        self.model.optimizer.learning_rate.assign(self.initial_lr * self.multiplier(epoch))

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._active(epoch):
            self._set(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase or not self._active(self.current_epoch):
            return
        steps = self.steps_per_epoch or self.params.get("steps")
        if not steps:
            raise ValueError("LearningRateScheduleCallback(staircase=False) needs steps_per_epoch (model.fit did "
                             "not report steps)")
        self._set(self.current_epoch + batch / steps)


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's: keep only the best model by ``monitor``; the file path is set later (``callback.filepath``), as
    Horovod's Estimator does."""

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto", save_freq="epoch"):
        super().__init__(filepath="best.keras" if not save_weights_only else "best.weights.h5", monitor=monitor,
                         verbose=verbose, save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Goyal et al. 2017 ("Accurate, Large Minibatch SGD"), as Horovod does it: over the first `warmup_epochs`
    epochs the learning rate rises linearly from initial_lr / size to initial_lr, batch by batch:

        lr(e) = initial_lr / size * (e * (size - 1) / warmup_epochs + 1),  e = epoch + batch / steps_per_epoch.
    """ + MOMENTUM_CORRECTION

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0,
                 size=None):
        super().__init__()
        self.momentum_correction = momentum_correction
        if not initial_lr > 0:
            raise ValueError(f"initial_lr must be > 0, got {initial_lr!r}")
        if not warmup_epochs > 0:
            raise ValueError(f"warmup_epochs must be > 0, got {warmup_epochs!r}")
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.size = size
        self.current_epoch = 0
        self._finished = False

    def lr_at(self, epoch_progress):
        size = self.size or hvd.size()
        if epoch_progress >= self.warmup_epochs:
            return self.initial_lr
        return self.initial_lr / size * (epoch_progress * (size - 1) / self.warmup_epochs + 1)

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch >= self.warmup_epochs:
            if not self._finished:  # the last warmup batch ended just below initial_lr
                self.model.optimizer.learning_rate.assign(self.initial_lr)
                self._finished = True
            return
        steps = self.steps_per_epoch or self.params.get("steps")
        if not steps:
            raise ValueError("LearningRateWarmupCallback needs steps_per_epoch (model.fit did not report steps)")
        self.model.optimizer.learning_rate.assign(self.lr_at(self.current_epoch + batch / steps))

    def on_epoch_end(self, epoch, logs=None):
        if self.verbose and epoch + 1 == self.warmup_epochs and hvd.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self.initial_lr:g}.")


class ReportLossCallback(keras.callbacks.Callback):
    """For model.fit with hvd.LeaderOptimizer: after every batch, report the training loss Keras logs (its
    running mean over the epoch) to the optimizer, whose leader election averages what it was given."""

    def on_train_batch_end(self, batch, logs=None):
        if logs and "loss" in logs:
            self.model.optimizer.report_loss(float(logs["loss"]))
