"""Elastic Keras 3 ``model.fit`` with horovod_ext's optimizers, under ``horovodrun --gloo -np 2 --min-np 1
--max-np 3 --host-discovery-script`` (tests/test_elastic.py).

    python elastic_keras_worker.py EPOCHS STEPS_PER_EPOCH KILL_AT ADD_AT [METHOD]

METHOD: topk (DistributedOptimizer, top-k with error feedback; the default), lsgd (LeaderOptimizer, multi-leader:
groups="node", each horovodrun host a node), easgd (ElasticAveragingOptimizer) or diloco (DiLoCoOptimizer, streaming:
two fragments, one exchanged every 5 steps and applied a step later, so one is pending at every commit; the best
worker's ternary pseudo-gradient as the outer step, groups="node"). The parameter-space optimizers' final weights are
what every rank evaluates: the elected leader's (LSGD), EASGD's center or DiLoCo's outer parameters.

Horovod's documented pattern: KerasState, CommitStateCallback (every 5 batches and each epoch's end),
UpdateBatchStateCallback, UpdateEpochStateCallback, ``fit(epochs=EPOCHS - state.epoch)`` inside ``hvd.elastic.run``.
The rank started on 127.0.0.1 SIGKILLs itself at the start of global batch KILL_AT; at the end of the batch before
global batch ADD_AT rank 0 puts 127.0.0.1 back and adds a third name of this machine (as elastic_worker.py does)."""
import contextlib
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402

import horovod_ext.tensorflow.keras as hvd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hvdrun import marker, write_hosts, write_result  # noqa: E402

KILLED, ADDED = marker("killed", "keras"), marker("added", "keras")
FEATURES, CLASSES, BATCH = 32, 4, 32


def data():
    rng = np.random.default_rng(1)
    teacher = rng.standard_normal((FEATURES, CLASSES))
    x = rng.standard_normal((5120, FEATURES)).astype(np.float32)
    y = (x @ teacher + 0.5 * rng.standard_normal((5120, CLASSES))).argmax(1)
    return x[:4096], y[:4096], x[4096:], y[4096:]


class Faults(keras.callbacks.Callback):
    def __init__(self, state, steps_per_epoch, kill_at, add_at):
        super().__init__()
        self.state, self.per_epoch, self.kill_at, self.add_at = state, steps_per_epoch, kill_at, add_at
        self.started_on = os.environ.get("HOROVOD_HOSTNAME")

    def global_batch(self, batch):
        return self.state.epoch * self.per_epoch + self.state.batch + batch

    def on_train_batch_begin(self, batch, logs=None):
        if self.started_on == "127.0.0.1" and not os.path.exists(KILLED) \
                and self.state.epoch * self.per_epoch + batch + self.done_before == self.kill_at:
            write_hosts(["localhost:1"])
            open(KILLED, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_begin(self, logs=None):
        self.done_before = self.state.batch  # fit() starts the epoch's count again after a reset

    def on_epoch_begin(self, epoch, logs=None):
        if epoch > 0:
            self.done_before = 0

    def on_train_batch_end(self, batch, logs=None):
        done = self.state.epoch * self.per_epoch + batch + self.done_before + 1
        if done == self.add_at and hvd.rank() == 0 and os.path.exists(KILLED) and not os.path.exists(ADDED):
            time.sleep(2.5)  # Horovod's blacklist cooldown (1-2 s) ends
            write_hosts(["localhost:1", "127.0.0.1:1", f"{os.environ['HVDEXT_THIRD_HOST']}:1"])
            open(ADDED, "w").close()
            deadline = time.time() + 60
            while self.state._host_messages.empty() and time.time() < deadline:
                time.sleep(0.1)


def make_optimizer(method):
    base = keras.optimizers.SGD(0.05, momentum=0.9)
    if method == "lsgd":
        return hvd.LeaderOptimizer(base, period=2, global_period=4)
    if method == "easgd":
        return hvd.ElasticAveragingOptimizer(base, beta=0.2, period=2)  # a center not synchronized would show
    if method == "diloco":  # streaming: 2 fragments, one every 5 steps, each applied a step after its exchange,
        # so that one is pending at the addition (step 35); ternary pseudo-gradients; a host's ranks one worker
        return hvd.DiLoCoOptimizer(base, inner_steps=10, fragments=2, overlap=1, groups="node", outer="leader",
                                   compression=hvd.Compression.ternary(error_feedback=True))
    return hvd.DistributedOptimizer(base, compression=hvd.Compression.topk(ratio=0.05))


def main():
    epochs, per_epoch, kill_at, add_at = map(int, sys.argv[1:5])
    method = sys.argv[5] if len(sys.argv) > 5 else "topk"
    hvd.init()
    x, y, x_test, y_test = data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(CLASSES)])
    opt = make_optimizer(method)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append((int(state.epoch), int(state.batch), hvd.size()))])
    callbacks = [Faults(state, per_epoch, kill_at, add_at),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=5),
                 hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state)]
    if method in ("lsgd", "diloco"):  # the elections' training loss
        callbacks.append(hvd.callbacks.ReportLossCallback())

    @hvd.elastic.run
    def train(state):
        n, r = hvd.size(), hvd.rank()
        model.fit(x[r::n], y[r::n], batch_size=BATCH, steps_per_epoch=per_epoch, epochs=epochs - state.epoch,
                  callbacks=callbacks, shuffle=False, verbose=0)

    train(state)
    with (opt.evaluation_parameters() if method != "topk" else contextlib.nullcontext()):
        params = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
        accuracy = float((model.predict(x_test, verbose=0).argmax(1) == y_test).mean())
    stats = opt.compression_stats()
    result = {"rank": hvd.rank(), "size": hvd.size(), "epoch": int(state.epoch),
              "iterations": int(opt.iterations.numpy()), "aggregator_steps": stats["steps"],
              "started_on": os.environ.get("HOROVOD_HOSTNAME"), "resets": resets, "accuracy": accuracy,
              "params": params.tolist()}
    write_result(hvd.rank(), result)


if __name__ == "__main__":
    main()
