"""Multi-process checks of horovod_ext.tensorflow (run by horovodrun): the averaged gradient against the NumPy
reference, the callbacks, and bad inputs on every rank."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_ext.tensorflow as hvd  # noqa: E402
import horovod_ext.tensorflow.keras as hvd_keras  # noqa: E402
from horovod_ext.compression.wire import tensor_key  # noqa: E402
from horovod_ext.tensorflow.optimizer import variable_names  # noqa: E402
from hvdext_reference import terngrad as ref  # noqa: E402
from hvdrun import expect_error, write_result  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()


def model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((20,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)])


def batch(step):
    rng = np.random.default_rng(100 * step + RANK)
    return rng.standard_normal((8, 20)).astype(np.float32), rng.integers(0, 3, 8)


def loss_of(m, x, y):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, m(x), from_logits=True))


def check_mean(compression, graph):
    """Every rank's averaged gradient equals the NumPy mean of all ranks' decoded payloads."""
    m = model()
    names = variable_names(m.trainable_variables)

    def grads_of(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(m, x, y)
        raw = tape.gradient(loss, m.trainable_variables)
        with tf.GradientTape() as tape:
            loss = loss_of(m, x, y)
        averaged = hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, m.trainable_variables)
        return raw, averaged

    fn = tf.function(grads_of) if graph else grads_of
    tape_probe = hvd.DistributedGradientTape(tf.GradientTape(), compression=compression)
    mismatches = []
    for step in range(3):
        raw, averaged = fn(*batch(step))
        seed = int(tape_probe.aggregator.seed.numpy()) % 2 ** 64
        agg_step = int(tape_probe.aggregator.step.numpy()) - 1
        for name, g, a in zip(names, raw, averaged):
            gathered = hvd.allgather(tf.reshape(g, [1, -1])).numpy()
            scale = None
            if compression.shared_scale:
                scale = max(ref.local_scale(gathered[r], compression.clip)[1] for r in range(SIZE))
            payloads = [ref.encode(gathered[r], clip=compression.clip, packing=compression.for_device("cpu").packing,
                                   seed=seed, step=agg_step, tensor=tensor_key(name), rank=r, scale=scale)
                        for r in range(SIZE)]
            want = ref.decode_average(payloads, gathered.shape[1], compression.for_device("cpu").packing, SIZE)
            if not np.array_equal(a.numpy().reshape(-1), want):
                mismatches.append(f"step {step} {name}")
    return {"mismatches": mismatches, "transport": tape_probe.compression_stats().get("transport")}


def check_callbacks():
    m = model(seed=RANK)  # different starts
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=hvd_keras.Compression.ternary)
    m.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    lrs, logs_seen = [], []

    class Probe(keras.callbacks.Callback):
        def on_train_batch_begin(self, b, logs=None):
            lrs.append(float(self.model.optimizer.learning_rate.numpy()))

        def on_epoch_end(self, epoch, logs=None):
            logs_seen.append(dict(logs))

    class RankMetric(keras.callbacks.Callback):  # a metric that differs per rank, before averaging
        def on_epoch_end(self, epoch, logs=None):
            logs["rank_metric"] = float(RANK)

    x, y = batch(0)
    m.fit(np.repeat(x, 4, axis=0), np.repeat(y, 4), batch_size=8, epochs=3, verbose=0, shuffle=False, callbacks=[
        hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0), RankMetric(),
        hvd_keras.callbacks.MetricAverageCallback(),
        hvd_keras.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2), Probe()])
    m.train_on_batch(x, y)  # the other Keras entry point through apply_gradients
    flat = tf.concat([tf.reshape(tf.cast(w, tf.float32), [-1]) for w in m.weights + opt.variables], axis=0)
    everyone = hvd.allgather(tf.reshape(flat, [1, -1]))
    return {"identical": bool(tf.reduce_all(tf.equal(everyone, everyone[0])).numpy()), "lrs": lrs,
            "steps": opt.compression_stats()["steps"],
            "rank_metric": [entry["rank_metric"] for entry in logs_seen],
            "loss": [entry["loss"] for entry in logs_seen]}


def tape_step(compression, variables=None, poison=None, graph=False):
    m = model()
    variables = variables or m.trainable_variables

    extra = [v for v in variables if not any(v is w for w in m.trainable_variables)]

    def run():
        x, y = batch(0)
        if poison is not None and RANK == SIZE - 1:
            x[0, 0] = poison
        with tf.GradientTape() as tape:
            loss = loss_of(m, x, y)
            for v in extra:  # a variable of another dtype that receives a gradient
                loss += tf.reduce_sum(tf.math.real(v)) * 0
        return hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, variables)

    return tf.function(run)() if graph else run()


def bad_inputs():
    ternary = hvd.Compression.ternary(min_size=0)
    m = model()
    cases = [
        expect_error("nan", lambda: tape_step(hvd.Compression.ternary(min_size=0, seed=1), poison=np.nan)),
        expect_error("nan_graph", lambda: tape_step(hvd.Compression.ternary(min_size=0, seed=2), poison=np.nan,
                                                    graph=True)),
        expect_error("inf_shared", lambda: tape_step(hvd.Compression.ternary(min_size=0, shared_scale=True, seed=3),
                                                     poison=np.inf)),
        expect_error("mismatch",
                     lambda: tape_step(hvd.Compression.ternary(min_size=0, clip=2.5 if RANK == 0 else 3.0))),
        expect_error("complex", lambda: tape_step(ternary, variables=m.trainable_variables
                                                  + [tf.Variable(tf.zeros([3], tf.complex64), name="cplx")])),
        expect_error("int", lambda: hvd.DistributedGradientTape(tf.GradientTape(), compression=ternary).aggregator
                     .aggregate([tf.zeros([4], tf.int32)], [tf.Variable(tf.zeros([4], tf.int32), name="counter")])),
        expect_error("empty", lambda: hvd.DistributedGradientTape(tf.GradientTape(), compression=ternary).aggregator
                     .aggregate([tf.zeros([0])], [tf.Variable(tf.zeros([0]), name="nothing")])),
        expect_error("keras2_optimizer", lambda: hvd_keras.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1))),
        expect_error("topk_nan", lambda: tape_step(hvd.Compression.topk(ratio=0.1), poison=np.nan)),
        expect_error("adaptive_inf", lambda: tape_step(hvd.Compression.adaptive_topk(window=3), poison=np.inf)),
        expect_error("packing", lambda: hvd.Compression.ternary(packing="3bit")),
        expect_error("clip", lambda: hvd.Compression.ternary(clip=-1)),
        expect_error("tape_groups", lambda: hvd.DistributedGradientTape(tf.GradientTape(), groups=2)),
        expect_error("keras_num_groups", lambda: hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                                                num_groups=2)),
    ]
    after = check_mean(hvd.Compression.ternary(min_size=0, seed=9), graph=False)
    return {"cases": cases, "after": after["mismatches"]}


def check_resume(compression, tmp):
    """3 steps, checkpoint (model, optimizer, the aggregator's step/seed/residuals/controller), 3 more steps; then
    restore and redo the last 3: the weights must be bit-identical."""
    m = model()
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    holder = {}

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(m, x, y)
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        holder["aggregator"] = tape.aggregator
        grads = tape.gradient(loss, m.trainable_variables)
        opt.apply_gradients(zip(grads, m.trainable_variables))

    for s in range(3):
        step(*batch(s))
    checkpoint = tf.train.Checkpoint(model=m, optimizer=opt, horovod_ext=holder["aggregator"])
    path = checkpoint.save(os.path.join(tmp, f"ckpt-{compression.name}-{RANK}"))
    start = np.concatenate([w.numpy().ravel() for w in m.weights])
    for s in range(3, 6):
        step(*batch(s))
    full = np.concatenate([w.numpy().ravel() for w in m.weights])
    totals = holder["aggregator"].compression_stats().get("totals", {"paths": {}})
    paths = [path for path, steps in totals["paths"].items() if steps]  # every path a step of the run took
    checkpoint.restore(path)
    for s in range(3, 6):
        step(*batch(s))
    resumed = np.concatenate([w.numpy().ravel() for w in m.weights])
    return {"identical": bool(np.array_equal(full, resumed)), "moved": bool(not np.array_equal(start, full)),
            "paths": paths}


if __name__ == "__main__":
    result = {"rank": RANK, "size": SIZE}
    result["mean_eager"] = check_mean(hvd.Compression.ternary(min_size=0, seed=5), graph=False)
    result["mean_graph"] = check_mean(hvd.Compression.ternary(min_size=0, packing="2bit"), graph=True)
    result["mean_shared"] = check_mean(hvd.Compression.ternary(min_size=0, shared_scale=True, transport="allgather"),
                                       graph=True)
    result["mean_two_phase"] = check_mean(hvd.Compression.ternary(min_size=0, shared_scale=True,
                                                                  transport="two_phase"), graph=True)
    result["callbacks"] = check_callbacks()
    import tempfile

    tmp = tempfile.mkdtemp()
    result["resume_topk"] = check_resume(hvd.Compression.topk(ratio=0.05), tmp)
    result["resume_adaptive"] = check_resume(hvd.Compression.adaptive_topk(min_cf=2, max_cf=50, epsilon=0.3, window=2,
                                                                           omega=0.0), tmp)
    result["resume_powersgd"] = check_resume(hvd.Compression.powersgd(rank=2, start_iter=1), tmp)
    result["bad_inputs"] = bad_inputs()
    write_result(RANK, result)
