"""GraVAC under horovodrun -np 2.

argv[1] torch or tf, argv[2] a delay in seconds injected into every payload collective (torch: waiting on the
allgather; TF: the eager allgather): trains a small MLP for 8 steps with adaptive_topk and records the step time the
controller was fed at each decision (its log's step_seconds).

argv[1] lag: the decision lag in PyTorch: each step's CF, path and the CF planned for the next, over 24 steps of an
uninterrupted run and of a run saved after 12 steps and resumed into a new model and optimizer (each rank loads
its own state_dict); whether the final parameters are the same bits."""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hvdrun import write_result  # noqa: E402

FRAMEWORK, DELAY, STEPS = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0, 8


def delayed(fn):
    def call(*args, **kwargs):
        time.sleep(DELAY)
        return fn(*args, **kwargs)
    return call


def run_torch():
    import torch
    import horovod_ext.torch as hvd
    from horovod_ext.torch.backend import TorchBackend
    hvd.init()
    TorchBackend.wait = delayed(TorchBackend.wait)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                   compression=hvd.Compression.adaptive_topk(window=3))
    gen = torch.Generator().manual_seed(hvd.rank())
    log = []  # the controller's log holds the last window: read its newest entry after each step
    for _ in range(STEPS):
        opt.zero_grad()
        model(torch.randn(8, 16, generator=gen)).pow(2).mean().backward()
        opt.step()
        log.append(opt.compression_stats()["log"][-1])
    return hvd, opt.compression_stats(), log


def run_tf():
    import horovod.tensorflow as horovod_tf
    import numpy as np
    import tensorflow as tf
    import horovod_ext.tensorflow as hvd
    hvd.init()
    horovod_tf.allgather = delayed(horovod_tf.allgather)  # what the aggregator calls, eagerly
    tf.random.set_seed(0)
    weights = [tf.Variable(tf.random.normal([16, 32], stddev=0.2)), tf.Variable(tf.random.normal([32, 4], stddev=0.2))]
    rng = np.random.default_rng(hvd.rank())
    compression = hvd.Compression.adaptive_topk(window=3)  # one aggregator (and controller) per compression
    log = []
    for _ in range(STEPS):
        x = tf.constant(rng.standard_normal((8, 16)), tf.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.nn.relu(x @ weights[0]) @ weights[1]))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        for w, g in zip(weights, tape.gradient(loss, weights)):
            w.assign_sub(0.1 * g)
        log.append(tape.compression_stats()["log"][-1])
    return hvd, tape.compression_stats(), log


def run_lag():
    import copy
    import torch
    import horovod_ext.torch as hvd
    hvd.init()
    torch.set_num_threads(1)

    def make(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        compression = hvd.Compression.adaptive_topk(min_cf=2, max_cf=64, epsilon=0.5, window=3, omega=0.0)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                       model.named_parameters(), compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model, opt

    def train(model, opt, first, count, record):
        for step in range(first, first + count):
            gen = torch.Generator().manual_seed(1000 * step + hvd.rank())
            x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 8, (16,), generator=gen)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            stats = opt.compression_stats()
            record.append([stats["cf"], stats["path"], stats["planned_cf"]])

    model, opt = make(0)
    uninterrupted = []
    train(model, opt, 0, 24, uninterrupted)
    final = [p.detach().clone() for p in model.parameters()]
    model, opt = make(0)
    resumed = []
    train(model, opt, 0, 12, resumed)
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
    model, opt = make(7)  # other weights, a fresh controller: all must come from the checkpoint
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    train(model, opt, 12, 12, resumed)
    same = all(torch.equal(a, b) for a, b in zip(final, model.parameters()))
    write_result(hvd.rank(), {"uninterrupted": uninterrupted, "resumed": resumed, "same_bits": same})


if FRAMEWORK == "lag":
    run_lag()
    sys.exit(0)
hvd, stats, log = run_torch() if FRAMEWORK == "torch" else run_tf()
write_result(hvd.rank(), {"steps": len(log), "step_seconds": [e["step_seconds"] for e in log],
                          "paths": [e["path"] for e in log], "throughput": {str(k): v for k, v in
                                                                            stats["throughput"].items()}})
