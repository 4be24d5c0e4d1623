"""Buckets in TensorFlow (tests/test_buckets.py): DistributedGradientTape, eagerly and inside tf.function, and the
Keras 3 DistributedOptimizer inside tf.function train a seven-layer MLP with each method at bucket_cap_mb 0, 0.03
and 25, on fixed seeds; each rank records the digest of its variables' bits and, eagerly, the Horovod collectives
the last step asked for (counted where horovod.tensorflow is called). Then bad bucket_cap_mb values are given to
DistributedGradientTape and DistributedOptimizer on every rank. argv[1] (optional): the methods to run, comma-separated
(default: every one of methods())."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import horovod.tensorflow as hvd_module  # noqa: E402

from bucket_cases import CAPS, TF_METHODS, WIDTHS, CollectiveCount, batches, digest, specs  # noqa: E402
from hvdrun import write_result  # noqa: E402

COUNT = CollectiveCount(hvd_module, ("allreduce", "allgather", "alltoall"))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_ext.tensorflow as hvd  # noqa: E402  (after the count)
import horovod_ext.tensorflow.keras as hvdk  # noqa: E402


def methods():
    all_ = specs(hvd.Compression)
    return {name: all_[name] for name in TF_METHODS}


def variables():
    rng = np.random.default_rng(0)
    out = []
    for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        out += [tf.Variable((rng.standard_normal((a, b)) * 0.2).astype(np.float32), name=f"w{i}"),
                tf.Variable(np.zeros(b, np.float32), name=f"b{i}")]
    return out


def loss_of(vs, x, y):
    h = x
    for i in range(0, len(vs), 2):
        h = h @ vs[i] + vs[i + 1]
        if i + 2 < len(vs):
            h = tf.tanh(h)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, h))


def data(rank):
    return [(tf.constant(x), tf.constant(y)) for x, y in batches(rank)]


def bits(vs):
    return digest(v.numpy() for v in vs)


def tape_run(comp, cap, graph):
    vs = variables()

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(vs, x, y)
        tape = hvd.DistributedGradientTape(tape, compression=comp, bucket_cap_mb=cap)
        for v, g in zip(vs, tape.gradient(loss, vs)):
            v.assign_sub(0.1 * g)

    fn = tf.function(step) if graph else step
    for x, y in data(hvd.rank()):
        before = COUNT.calls
        fn(x, y)
    # the tapes of one compression and cap share an aggregator (Horovod's idiom makes a tape a step)
    stats = hvd.DistributedGradientTape(tf.GradientTape(), compression=comp, bucket_cap_mb=cap) \
        .aggregator.compression_stats()
    return {"digest": bits(vs), "collectives": None if graph else COUNT.calls - before,
            "buckets": stats.get("buckets")}


def keras_run(comp, cap):
    vs = variables()
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), compression=comp, bucket_cap_mb=cap)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(vs, x, y)
        opt.apply(tape.gradient(loss, vs), vs)

    for x, y in data(hvd.rank()):
        step(x, y)
    return {"digest": bits(vs), "buckets": opt.compression_stats().get("buckets")}


def bad_input():
    said = {}
    for value in (-1, "25", float("nan"), None):
        for what, make in (("tape", lambda v: hvd.DistributedGradientTape(tf.GradientTape(), bucket_cap_mb=v)),
                           ("keras", lambda v: hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                                         bucket_cap_mb=v))):
            try:
                make(value)
                said[f"{what} {value!r}"] = None
            except ValueError as exc:
                said[f"{what} {value!r}"] = str(exc)
    return said


def main():
    hvd.init()
    runs = {}
    chosen = sys.argv[1].split(",") if len(sys.argv) > 1 else list(methods())
    for name, comp in methods().items():
        if name not in chosen:
            continue
        for cap in CAPS:
            runs[f"eager/{name}@{cap}"] = tape_run(comp, cap, graph=False)
            runs[f"graph/{name}@{cap}"] = tape_run(comp, cap, graph=True)
            runs[f"keras/{name}@{cap}"] = keras_run(comp, cap)
    write_result(hvd.rank(), {"rank": hvd.rank(), "size": hvd.size(), "runs": runs, "bad_input": bad_input()})


if __name__ == "__main__":
    main()
