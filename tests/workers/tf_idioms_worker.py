"""Horovod's documented TensorFlow/Keras idioms against horovod_ext (run by horovodrun -np 2): gradient accumulation
(backward_passes_per_step, average_aggregated_gradients) in model.fit, in a tf.function loop and eagerly, for every
compressor; sparse gradients (IndexedSlices) with and without sparse_as_dense; local variables; a tape and a Keras
optimizer on a rank outside their process_set.
Each rank records what it saw; tests/test_tensorflow_idioms.py asserts on every rank's record."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_ext.tensorflow as hvd  # noqa: E402
import horovod_ext.tensorflow.keras as hvd_keras  # noqa: E402
from hvdrun import write_result  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
COMPRESSIONS = {
    "none": lambda: hvd.Compression.none,
    "fp16": lambda: hvd.Compression.fp16,
    "ternary": lambda: hvd.Compression.ternary(min_size=0),
    "topk": lambda: hvd.Compression.topk(ratio=0.1),
    "adaptive_topk": lambda: hvd.Compression.adaptive_topk(window=2, epsilon=0.3),
}


def model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])


def data(n=32):
    rng = np.random.default_rng(7 + RANK)
    return rng.standard_normal((n, 12)).astype(np.float32), rng.integers(0, 3, n)


def weights(m):
    return np.concatenate([w.reshape(-1) for w in m.get_weights()])


def fit(passes, batch_size, compression="none", average=True):
    m = model()
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5),
                                         compression=COMPRESSIONS[compression](), backward_passes_per_step=passes,
                                         average_aggregated_gradients=average)
    m.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data()
    m.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    return m, opt


def custom_loop(passes, batch_size, graph):
    m = model()
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5), backward_passes_per_step=passes,
                                         average_aggregated_gradients=True)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, m(x))
        opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))

    step = tf.function(train_step) if graph else train_step
    x, y = data()
    for epoch in range(2):
        for i in range(0, len(x), batch_size):
            step(x[i:i + batch_size], y[i:i + batch_size])
    return m, opt


def check_accumulation():
    record = {}
    one, _ = fit(1, 32)
    two, opt = fit(2, 16)
    record["fit"] = float(np.abs(weights(one) - weights(two)).max())
    record["fit_iterations"] = int(opt.iterations.numpy())
    record["fit_real_steps"] = int(opt.horovod_ext.step.numpy())
    for graph in (False, True):
        a, _ = custom_loop(1, 32, graph)
        b, _ = custom_loop(2, 16, graph)
        record[f"loop_graph{graph}"] = float(np.abs(weights(a) - weights(b)).max())
    summed, _ = fit(2, 16, average=False)  # summed: the same as one step at twice the learning rate
    record["summed_moved_more"] = float(np.abs(weights(summed) - weights(model())).max()) > \
        float(np.abs(weights(two) - weights(model())).max())
    for name in COMPRESSIONS:
        m, opt = fit(2, 16, name)
        gathered = hvd.allgather(tf.constant(weights(m)[None, :])).numpy()
        record[f"compressor_{name}"] = {"identical": bool((gathered == gathered[0]).all()),
                                        "real_steps": int(opt.horovod_ext.step.numpy()),
                                        "stats_steps": opt.compression_stats()["steps"]}
    return record


def embedding_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(500, 6),
                             keras.layers.Flatten(), keras.layers.Dense(2)])


def check_sparse(name, sparse_as_dense, graph):
    m = embedding_model()
    rng = np.random.default_rng(RANK)
    ids = tf.constant(rng.integers(0, 500, (8, 4)), dtype=tf.int32)

    def grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(m(ids))
        local = tape.gradient(loss, m.trainable_variables)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(m(ids))
        tape = hvd.DistributedGradientTape(tape, compression=COMPRESSIONS[name](), sparse_as_dense=sparse_as_dense)
        return local, tape.gradient(loss, m.trainable_variables)

    local, averaged = (tf.function(grads) if graph else grads)()
    is_sparse = isinstance(averaged[0], tf.IndexedSlices)
    dense_local = tf.convert_to_tensor(local[0])
    exact = hvd.allreduce(dense_local, op=hvd.Average, name=f"check.sparse.{name}.{sparse_as_dense}.{graph}")
    result = tf.convert_to_tensor(averaged[0])
    gathered = hvd.allgather(tf.reshape(result, [1, -1])).numpy()
    return {"sparse": is_sparse, "error": float(tf.reduce_max(tf.abs(result - exact))),
            "identical": bool((gathered == gathered[0]).all())}


def check_local_variables():
    """register_local_source: the gradient of a local variable is not communicated; with scale_local_gradients it is
    divided by the number of ranks."""
    v = tf.Variable([1.0 + RANK])
    w = tf.Variable([2.0])
    out = {}
    for scale in (True, False):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * v) + tf.reduce_sum(w * (1.0 + RANK))
        tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale)
        tape.register_local_source(v)
        gv, gw = tape.gradient(loss, [v, w])
        out[str(scale)] = [float(gv[0]), float(gw[0])]
    return out


def check_join(name, graph):
    """Rank r has 3 + 2r batches; a rank out of data calls hvd.join(). In the steps after it, the training rank applies
    Horovod's allreduce of what it sends: (g + r) / size, r the error-feedback residual (else 0)."""
    m = model()
    tape_kwargs = {"compression": COMPRESSIONS[name]()}

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, m(x), from_logits=True))
        local = tape.gradient(loss, m.trainable_variables)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, m(x), from_logits=True))
        dist = hvd.DistributedGradientTape(tape, **tape_kwargs)
        return local, dist.gradient(loss, m.trainable_variables)

    fn = tf.function(step) if graph else step
    x, y = data(8 * (3 + 2 * RANK))
    errors, aggregator = [], None
    for i in range(3 + 2 * RANK):
        probe = hvd.DistributedGradientTape(tf.GradientTape(), **tape_kwargs).aggregator
        residuals = {k: v.numpy() for k, v in probe.residuals.items()}
        local, averaged = fn(x[8 * i:8 * i + 8], y[8 * i:8 * i + 8])
        if i >= 3:
            names = [v.path for v in m.trainable_variables]
            expected = [(g.numpy() + residuals[n].reshape(g.shape) if n in residuals else g.numpy()) / SIZE
                        for n, g in zip(names, local)]
            errors.append(max(float(np.abs(a.numpy() - e).max()) for a, e in zip(averaged, expected)))
        aggregator = probe
    last = hvd.join()
    return {"last_joined": int(last), "errors": errors, "steps": int(aggregator.step.numpy()),
            "residual_left": max([float(np.abs(v.numpy()).max()) for v in aggregator.residuals.values()] or [0.0])}


# PowerSGD compresses the 12x8 kernel from the first step (rank 1: 20 values sent for 96)
PROCESS_SET_COMPRESSIONS = dict(COMPRESSIONS, powersgd=lambda: hvd.Compression.powersgd(rank=1, start_iter=0))


def check_process_set(name, even_set, odd_set):
    """Horovod's test_optimizer_process_sets in TensorFlow: every rank wraps its tape, and its Keras optimizer, with
    process_set=even_set. An odd rank (outside the set) keeps its own gradients, as with no wrapper at all, and
    nobody waits; the set's members agree. Records, per wrapper: equals the unwrapped run, identical in the set."""
    this_set = even_set if RANK % 2 == 0 else odd_set
    x, y = data()
    kwargs = {"compression": PROCESS_SET_COMPRESSIONS[name](), "process_set": even_set}

    def tape_run(wrapped):
        m = model(seed=5)
        opt = keras.optimizers.SGD(0.1)
        for i in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                    y[8 * i:8 * i + 8], m(x[8 * i:8 * i + 8]), from_logits=True))
            tape = hvd.DistributedGradientTape(tape, **kwargs) if wrapped else tape
            opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
        return weights(m)

    def fit_run(wrapped):
        m = model(seed=5)
        opt = keras.optimizers.SGD(0.1)
        m.compile(optimizer=hvd_keras.DistributedOptimizer(opt, **kwargs) if wrapped else opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        return weights(m)

    out = {}
    for kind, run in (("tape", tape_run), ("fit", fit_run)):
        mine, local = run(True), run(False)
        members = hvd.allgather(tf.constant(mine[None]), process_set=this_set, name=f"check.ps.{name}.{kind}")
        out[kind] = {"equals_local": bool(np.array_equal(mine, local)),
                     "set_identical": bool(all(np.array_equal(row, mine) for row in members.numpy()))}
    return out


def main():
    result = {"rank": RANK, "accumulation": check_accumulation(), "local": check_local_variables()}
    result["join"] = {name: check_join(name, graph=False) for name in COMPRESSIONS}
    result["sparse"] = {f"{name}.{dense}.{graph}": check_sparse(name, dense, graph)
                        for name in ("none", "ternary", "topk") for dense in (False, True) for graph in (False, True)}
    even_set = hvd.add_process_set([r for r in range(SIZE) if r % 2 == 0])
    odd_set = hvd.add_process_set([r for r in range(SIZE) if r % 2 == 1])
    result["process_set"] = {name: check_process_set(name, even_set, odd_set) for name in PROCESS_SET_COMPRESSIONS}
    # a barrier: the odd ranks communicate nothing, and must not remove the sets while an even rank uses them
    hvd.allreduce(tf.constant(0.0), name="process_set.done")
    hvd.remove_process_set(odd_set)
    hvd.remove_process_set(even_set)
    write_result(RANK, result)
    hvd.allreduce(tf.constant(0.0), name="done")


if __name__ == "__main__":
    main()
