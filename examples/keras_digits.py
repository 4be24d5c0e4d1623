"""Data-parallel Keras 3 training on scikit-learn's digits with horovod-ext, written like Horovod's Keras examples.

    horovodrun -np 2 python examples/keras_digits.py --compression none,ternary
    horovodrun -np 4 -H localhost:2,127.0.0.1:2 python examples/keras_digits.py --optimizer dp,lsgd,multi_lsgd,easgd

Each rank fits on its shard; rank 0 prints test accuracy and bytes per step for every listed compression.
--loop tape trains with a custom tf.function loop and DistributedGradientTape instead of model.fit.
--optimizer lsgd, multi_lsgd, easgd train with hvd.LeaderOptimizer / hvd.ElasticAveragingOptimizer instead of
data-parallel SGD (dp): every rank samples from the whole training set, as in both papers, for as many steps.
async_lsgd, async_multi_lsgd and async_easgd pass asynchronous=True, which TensorFlow runs synchronously, with a
warning (see horovod_ext.tensorflow.leader.SYNCHRONOUS_FALLBACK).
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import horovod_ext.tensorflow as hvd_tf  # noqa: E402
import horovod_ext.tensorflow.keras as hvd  # noqa: E402

COMPRESSIONS = {"none": lambda: hvd.Compression.none, "fp16": lambda: hvd.Compression.fp16,
                "ternary": lambda: hvd.Compression.ternary,
                "ternary-shared": lambda: hvd.Compression.ternary(shared_scale=True),
                "topk": lambda: hvd.Compression.topk(ratio=0.1),
                "adaptive_topk": lambda: hvd.Compression.adaptive_topk,  # GraVAC at its defaults
                "powersgd": lambda: hvd.Compression.powersgd,
                "auto": lambda: hvd.Compression.auto}  # each tensor's method chosen online
OPTIMIZERS = {"dp": None,
              "lsgd": lambda opt: hvd.LeaderOptimizer(opt, groups=None),
              "multi_lsgd": lambda opt: hvd.LeaderOptimizer(opt, groups="node"),
              "easgd": lambda opt: hvd.ElasticAveragingOptimizer(opt),
              "async_lsgd": lambda opt: hvd.LeaderOptimizer(opt, groups=None, asynchronous=True),
              "async_multi_lsgd": lambda opt: hvd.LeaderOptimizer(opt, groups="node", asynchronous=True),
              "async_easgd": lambda opt: hvd.ElasticAveragingOptimizer(opt, asynchronous=True)}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compression", default="none,ternary", help=f"comma-separated: {', '.join(COMPRESSIONS)}")
    parser.add_argument("--optimizer", default="dp", help=f"comma-separated: {', '.join(OPTIMIZERS)}")
    parser.add_argument("--loop", choices=["fit", "tape"], default="fit")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--hidden", type=int, default=256, help="the digits MLP's width (its second layer: half)")
    parser.add_argument("--data", choices=["digits", "synthetic"], default="digits",
                        help="digits, or synthetic (Gaussian inputs labelled by a random linear teacher)")
    parser.add_argument("--model-size", type=float, default=1e6, help="parameters of the synthetic run's MLP")
    parser.add_argument("--check-identical", action="store_true", help="assert identical weights after every epoch")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    names = args.compression.split(",")
    unknown = [n for n in names if n not in COMPRESSIONS]
    if unknown:
        parser.error(f"--compression: unknown {unknown}; allowed values are {', '.join(COMPRESSIONS)}")
    args.compression = names
    args.optimizer = args.optimizer.split(",")
    unknown = [n for n in args.optimizer if n not in OPTIMIZERS]
    if unknown:
        parser.error(f"--optimizer: unknown {unknown}; allowed values are {', '.join(OPTIMIZERS)}")
    return args


def load_data(seed, source="digits"):
    if source == "synthetic":  # Gaussian inputs labelled by a random linear teacher
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((4096, 64)).astype(np.float32)
        y = np.argmax(x @ rng.standard_normal((64, 10)), axis=1)
        x_train, x_test, y_train, y_test = x[:3072], x[3072:], y[:3072], y[3072:]
    else:
        digits = load_digits()
        x = (digits.data / 16.0).astype(np.float32)
        x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=seed,
                                                            stratify=digits.target)
    shard = np.arange(hvd.rank(), len(x_train), hvd.size())
    per_rank = len(x_train) // hvd.size()  # every rank takes the same number of steps
    shard = shard[:per_rank]
    return x_train[shard], y_train[shard], x_test, y_test, x_train, y_train


HIDDEN = [256]


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(HIDDEN[0], activation="relu"),
                             keras.layers.Dense(HIDDEN[0] // 2, activation="relu"), keras.layers.Dense(10)])


def weights_identical(model):
    flat = tf.concat([tf.reshape(w, [-1]) for w in model.weights], axis=0)
    everyone = hvd.allgather(tf.reshape(flat, [1, -1]))
    return bool(tf.reduce_all(tf.equal(everyone, everyone[0])).numpy())


class IdenticalWeights(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.per_epoch = []

    def on_epoch_end(self, epoch, logs=None):
        self.per_epoch.append(weights_identical(self.model))


class FactorLog(keras.callbacks.Callback):
    """The CF and path adaptive_topk took at each step, read after it (its controller keeps the last window)."""

    def __init__(self, source=None):
        super().__init__()
        self.source, self.steps = source, []

    def on_train_batch_end(self, batch, logs=None):
        self.record((self.source or self.model.optimizer).compression_stats())

    def record(self, stats):
        if "cf" in stats:
            self.steps.append((stats["cf"], stats["path"]))


def whole_set_batches(args, x_all, y_all):
    """LSGD / EASGD: this rank's batches drawn from the whole training set, in a rank-specific order."""
    data = tf.data.Dataset.from_tensor_slices((x_all, y_all)).shuffle(len(x_all), seed=args.seed + hvd.rank())
    return data.repeat().batch(args.batch_size, drop_remainder=True)


def train_fit(args, optimizer_name, name, data):
    x_train, y_train, x_test, y_test, x_all, y_all = data
    model = make_model(args.seed + hvd.rank())  # different starts: the broadcast callback makes them equal
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
    if optimizer_name == "dp":
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9), compression=COMPRESSIONS[name]())
        inputs = dict(x=x_train, y=y_train, batch_size=args.batch_size, shuffle=True)
    else:
        opt = OPTIMIZERS[optimizer_name](keras.optimizers.SGD(args.lr, momentum=0.9))
        callbacks.append(hvd.callbacks.ReportLossCallback())  # the leader is elected by the training loss
        inputs = dict(x=whole_set_batches(args, x_all, y_all), steps_per_epoch=len(x_train) // args.batch_size)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    identical, factors = IdenticalWeights(), FactorLog()
    model.fit(epochs=args.epochs, verbose=0, callbacks=callbacks + [identical, factors], **inputs)
    return model, opt, identical.per_epoch, factors.steps


def train_tape(args, optimizer_name, name, data):
    x_train, y_train, x_test, y_test, x_all, y_all = data
    model = make_model(args.seed)
    opt = keras.optimizers.SGD(args.lr, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = COMPRESSIONS[name]()
    stats = {}

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd_tf.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        stats["tape"] = tape
        return loss

    per_epoch, factors = [], FactorLog()
    rng = np.random.default_rng(args.seed + hvd.rank())
    for _ in range(args.epochs):
        order = rng.permutation(len(x_train))
        for i in range(0, len(order) - args.batch_size + 1, args.batch_size):
            idx = order[i:i + args.batch_size]
            step(tf.constant(x_train[idx]), tf.constant(y_train[idx]))
            factors.record(stats["tape"].compression_stats())
        per_epoch.append(weights_identical(model))
    return model, stats["tape"], per_epoch, factors.steps


def main():
    args = parse_args()
    hvd.init()
    data = load_data(args.seed, args.data)
    HIDDEN[0] = args.hidden
    if args.data == "synthetic":  # width h of 64*h + h*h/2 + ... weights, about --model-size parameters
        HIDDEN[0] = max(16, int(-64 + (64 ** 2 + 2 * args.model_size) ** 0.5))
    results = []
    runs = [(o, c) for o in args.optimizer for c in (args.compression if o == "dp" else [None])]
    for optimizer_name, name in runs:
        if optimizer_name != "dp" and args.loop != "fit":
            raise SystemExit(f"--optimizer {optimizer_name} runs with --loop fit")
        model, source, identical, factors = (train_fit if args.loop == "fit" else train_tape)(args, optimizer_name,
                                                                                              name, data)
        stats = source.compression_stats()
        if optimizer_name == "dp":
            accuracy = float(np.mean(np.argmax(model.predict(data[2], verbose=0), axis=1) == data[3]))
        else:
            with source.evaluation_parameters():  # LSGD: the best worker's weights; EASGD: the center
                accuracy = float(np.mean(np.argmax(model.predict(data[2], verbose=0), axis=1) == data[3]))
            name = optimizer_name
        if args.check_identical and optimizer_name == "dp":
            assert all(identical), ("weights differ across ranks after epochs "
                                    f"{[i for i, ok in enumerate(identical) if not ok]}")
        total, steps = stats["total"], max(stats["steps"], 1)
        results.append({"compression": name, "optimizer": optimizer_name, "test_accuracy": accuracy,
                        "identical_every_epoch": all(identical), "epochs_checked": len(identical),
                        "steps": stats["steps"],
                        "bytes_per_step": total["payload_bytes"] / steps,
                        "dense_bytes_per_step": total["dense_bytes"] / steps,
                        "bits_per_element": total["bits_per_element"],
                        "cf_log": [cf for cf, _ in factors], "paths": [path for _, path in factors]})
        if "throughput" in stats:  # GraVAC: the CF it settled on (None while exploring) and the table it settles from
            results[-1]["gravac"] = {"theta_ideal": stats["theta_ideal"],
                                     "throughput": [[cf, t, n] for cf, (t, n) in stats["throughput"].items()]}
    if hvd.rank() == 0:
        print(f"{args.data} MLP (Keras 3, {args.loop}, hidden {HIDDEN[0]}), {hvd.size()} ranks, {args.epochs} epochs")
        print(f"{'compression':<15} {'test acc':>8} {'bytes/step':>11} {'dense bytes':>11} {'ratio':>6} "
              f"{'bits/elem':>9}")
        for r in results:
            print(f"{r['compression']:<15} {100 * r['test_accuracy']:>7.2f}% {r['bytes_per_step']:>11.0f} "
                  f"{r['dense_bytes_per_step']:>11.0f} {r['dense_bytes_per_step'] / r['bytes_per_step']:>5.1f}x "
                  f"{r['bits_per_element']:>9.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": hvd.size(), "loop": args.loop, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
