"""Compression.auto under horovodrun -np 2, PyTorch then TensorFlow (eagerly) in one process.

The link is the probe's answer on loopback, or (a "slow" run) a 100 Mbit/s-like link put in place of the probe, so
that compression pays; a slow run's biases choose between none and fp16 (min_size 1024), so that its choice mixes
methods (one step by several methods, in both frameworks). A slow run also puts fixed figures in place of the
clock's (each candidate's kernel seconds, the step's compute and overlap) and leaves the steps untimed (no measured
step overrules the model), so that its choice depends on the gradients alone and not on how loaded the machine is.
Records, per rank: each run's choice at each window's end (compression_stats()["choice"]'s methods), the final
parameters' checksum, whether a resumed run (a checkpoint of rank 0 loaded on rank 0, then Horovod's
broadcast_optimizer_state) continued the choice it saved, the error of a bad argument. TensorFlow runs eagerly and
inside tf.function, and Keras's compiled fit."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hvdrun import expect_error, write_result  # noqa: E402

from horovod_ext.compressors.auto import measure as auto_measure, method as auto_method  # noqa: E402
from horovod_ext.compressors.auto.choice import Link  # noqa: E402

WINDOW, STEPS = 4, 12
SMALL = 1024  # a slow run's min_size: smaller tensors (the biases) choose between none and fp16
SLOW = Link(latency={"allreduce": 2e-3, "allgather": 1e-3, "factors": 4e-3},
            slope={"allreduce": 1.6e-7, "allgather": 1.6e-7, "factors": 1.6e-7})
KERNEL_SECONDS = (2e-5, 2e-9)  # a payload candidate's kernels: fixed seconds, and seconds per element
COMPUTE_SECONDS = 4e-3  # the step's compute; no overlap
_probe, _round_trip = auto_method.probe_link, auto_method.round_trip
_step, _interval = auto_measure.Measures.step, auto_measure.Measures.interval


def fixed_round_trip(be, ctx, item, x, candidate, shape):
    gain, _, nbytes = _round_trip(be, ctx, item, x, candidate, shape)
    return gain, 0.0 if candidate == "none" else KERNEL_SECONDS[0] + KERNEL_SECONDS[1] * item.numel, nbytes


def fixed_step(measures, compute, overlap):
    _step(measures, COMPUTE_SECONDS, 0.0)


def use_link(slow):
    """The slow link and fixed measured seconds, or the probe's link and the clock's seconds."""
    auto_method.probe_link = (lambda be, flat, seconds, tag: SLOW) if slow else _probe
    auto_method.round_trip = fixed_round_trip if slow else _round_trip
    auto_measure.Measures.step = fixed_step if slow else _step
    auto_measure.Measures.interval = (lambda measures, seconds: None) if slow else _interval


def choice_methods(stats):
    return {name: entry["method"] for name, entry in sorted(stats["choice"].items())}


def torch_run(slow, steps=STEPS, resume_at=None):
    import torch
    import horovod_ext.torch as hvd
    use_link(slow)
    torch.manual_seed(0)

    def make():
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                    torch.nn.ReLU(), torch.nn.Linear(256, 4))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                                       compression=hvd.Compression.auto(window=WINDOW, min_size=SMALL if slow else 0))
        return model, opt

    model, opt = make()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(1 + hvd.rank())
    windows, resumed = [], None
    for step in range(steps):
        if step == resume_at:
            saved = {"model": model.state_dict(), "opt": opt.state_dict()}
            before = choice_methods(opt.compression_stats())
            model, opt = make()
            if hvd.rank() == 0:
                model.load_state_dict(saved["model"])
                opt.load_state_dict(saved["opt"])
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(opt, root_rank=0)
        x = torch.randn(32, 64, generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1)).backward()
        opt.step()
        if step == resume_at:
            resumed = {"before": before, "after": choice_methods(opt.compression_stats())}
        if (step + 1) % WINDOW == 0:
            windows.append(choice_methods(opt.compression_stats()))
    stats = opt.compression_stats()
    return {"windows": windows, "resumed": resumed,
            "checksum": float(sum(p.double().sum() for p in model.parameters())),
            "gains": {n: e["gain"] for n, e in stats["choice"].items()}, "changes": stats["choice_changes"],
            "ratio": stats["total"]["ratio"]}


def tf_run(slow, traced):
    import numpy as np
    import tensorflow as tf
    import horovod_ext.tensorflow as hvd
    hvd.init()
    use_link(slow)
    tf.random.set_seed(0)
    w = [tf.Variable(tf.random.normal([64, 256], stddev=0.1)), tf.Variable(tf.random.normal([256], stddev=0.1)),
         tf.Variable(tf.random.normal([256, 4], stddev=0.1))]
    hvd.broadcast_variables(w, root_rank=0)
    rng = np.random.default_rng(1 + hvd.rank())
    # one aggregator per compression spec: the traced run's differs from the eager run's
    compression = hvd.Compression.auto(window=WINDOW, margin=0.04 if traced else 0.05, min_size=SMALL)

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.nn.relu(x @ w[0] + w[1]) @ w[2]))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        for v, g in zip(w, tape.gradient(loss, w)):
            v.assign_sub(0.1 * g)
        return loss

    step = tf.function(step) if traced else step
    windows = []
    for i in range(STEPS):
        step(tf.constant(rng.normal(size=(32, 64)), tf.float32))
        if (i + 1) % WINDOW == 0:
            stats = hvd.DistributedGradientTape(tf.GradientTape(), compression=compression).compression_stats()
            windows.append(choice_methods(stats))
    return {"windows": windows, "checksum": float(sum(tf.reduce_sum(tf.cast(v, tf.float64)) for v in w)),
            "ratio": stats["total"]["ratio"]}


def keras_run():
    """Keras 3's compiled fit (a traced train step) with Compression.auto on the slow link."""
    import keras
    import numpy as np
    import horovod_ext.tensorflow.keras as hvd
    hvd.init()
    use_link(True)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(4)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                   compression=hvd.Compression.auto(window=WINDOW, min_size=SMALL))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    rng = np.random.default_rng(1 + hvd.rank())
    x = rng.normal(size=(32 * STEPS, 64)).astype("float32")
    history = model.fit(x, x[:, :4].argmax(1), batch_size=32, epochs=2, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    stats = opt.compression_stats()
    return {"choice": choice_methods(stats), "losses": [float(v) for v in history.history["loss"]],
            "checksum": float(sum(np.sum(w.numpy(), dtype=np.float64) for w in model.trainable_weights))}


def main():
    import horovod_ext.torch as hvd
    hvd.init()
    from horovod_ext.torch import Compression
    result = {"torch_loopback": torch_run(False), "torch_slow": torch_run(True),
              "torch_resumed": torch_run(True, resume_at=6), "tf_slow": tf_run(True, False),
              "tf_traced_slow": tf_run(True, True), "keras_slow": keras_run(),
              "bad": [expect_error("epsilon", lambda: Compression.auto(epsilon=1.5)),
                      expect_error("candidates", lambda: Compression.auto(candidates=[])),
                      expect_error("unknown", lambda: Compression.auto(candidates=["none", "top_k"]))]}
    write_result(hvd.rank(), result)


if __name__ == "__main__":
    main()
