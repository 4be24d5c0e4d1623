"""random-k, defined only in tests/randomk.py, end to end under horovodrun: argv[1] "torch", "tf" or "tf_graph".
Four steps of a model with tensors of 5003, 37 and 2048 elements; records every rank's applied averaged gradients
and its compression_stats() so that the test compares them with a NumPy reference of the same algorithm."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from hvdrun import write_result  # noqa: E402
from randomk import RandomK  # noqa: E402
from horovod_ext.compression import register  # noqa: E402

FRAMEWORK = sys.argv[1]
SIZES = (5003, 37, 2048)
STEPS = 4
register(RandomK())  # also reachable as hvd.Compression.randomk, in both frameworks
SPEC = RandomK(ratio=0.05, seed=11)


def gradients(step, rank):
    rng = np.random.default_rng(1000 * step + rank)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def run_torch():
    import torch
    import horovod_ext.torch as hvd
    hvd.init()
    assert hvd.Compression.randomk == RandomK()
    params = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1.0),
                                   named_parameters=[(f"w{i}", p) for i, p in enumerate(params)], compression=SPEC)
    applied = []
    for step in range(STEPS):
        opt.zero_grad()
        for p, g in zip(params, gradients(step, hvd.rank())):
            (p * torch.from_numpy(g)).sum().backward()
        opt.synchronize()
        applied.append([p.grad.numpy().tolist() for p in params])
        with opt.skip_synchronize():
            opt.step()
    return hvd, applied, opt.compression_stats()


def run_tf(graph):
    import tensorflow as tf
    import horovod_ext.tensorflow as hvd
    hvd.init()
    assert hvd.Compression.randomk == RandomK()
    variables = [tf.Variable(tf.zeros([n]), name=f"w{i}") for i, n in enumerate(SIZES)]
    holder = {}

    def step_fn(gs):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(variables, gs)])
        tape = hvd.DistributedGradientTape(tape, compression=SPEC)
        holder["tape"] = tape
        return tape.gradient(loss, variables)

    fn = tf.function(step_fn) if graph else step_fn
    applied = []
    for step in range(STEPS):
        grads = fn([tf.constant(g) for g in gradients(step, hvd.rank())])
        applied.append([g.numpy().tolist() for g in grads])
    return hvd, applied, holder["tape"].compression_stats()


hvd, applied, stats = run_torch() if FRAMEWORK == "torch" else run_tf(FRAMEWORK == "tf_graph")
write_result(hvd.rank(), {"rank": hvd.rank(), "size": hvd.size(), "applied": applied,
                          "payload_bytes": stats["total"]["payload_bytes"], "steps": stats["steps"]})
