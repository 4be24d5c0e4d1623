"""A seeded training script, as a Horovod user writes one (tests/test_seeds.py): the script seeds its framework
(torch.manual_seed, keras.utils.set_random_seed) with each seed of argv[1:] in turn and leaves every compressor at its
defaults (seed=None); the weights start from a fixed NumPy draw, so that the script's seed reaches the model only
through the compressors' draws (ternary's stochastic rounding, PowerSGD's initial Q). Each rank records, per seed,
framework and method, the digest of its final parameters' bits and the key the ranks agreed on. SEED_WORKER_FRAMEWORKS
(default "torch,keras") picks the frameworks."""
import hashlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from hvdrun import write_result  # noqa: E402

SEEDS = [int(a) for a in sys.argv[1:]]
METHODS = ("none", "ternary", "powersgd")  # dense: the control, which draws nothing
STEPS, BATCH = 14, 32  # PowerSGD compresses from step 10 (start_iter) on
SHAPES = [(64, 128), (128,), (128, 10), (10,)]  # two matrices of >= 1024 elements (ternary's min_size)


def initial_weights():
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in SHAPES]


def data(rank):
    rng = np.random.default_rng(100 + rank)
    return rng.standard_normal((STEPS * BATCH, 64)).astype(np.float32), rng.integers(0, 10, STEPS * BATCH)


def digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def run_torch(seed, method):
    import torch
    import horovod_ext.torch as hvd

    torch.manual_seed(seed)
    w1, b1, w2, b2 = (torch.nn.Parameter(torch.from_numpy(w.copy())) for w in initial_weights())
    named = [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)]
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.1), named_parameters=named,
                                   compression=getattr(hvd.Compression, method))
    x, y = (torch.from_numpy(a) for a in data(hvd.rank()))
    for step in range(STEPS):
        xb, yb = x[step * BATCH:(step + 1) * BATCH], y[step * BATCH:(step + 1) * BATCH]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(torch.tanh(xb @ w1 + b1) @ w2 + b2, yb)
        loss.backward()
        opt.step()
    return {"digest": digest([p.detach().numpy() for _, p in named]), "seed": opt.compression_stats().get("seed")}


def run_keras(seed, method):
    import keras
    import horovod_ext.tensorflow.keras as hvd

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="tanh"), keras.layers.Dense(10)])
    model.set_weights(initial_weights())
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=getattr(hvd.Compression, method))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(hvd.rank())
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return {"digest": digest(model.get_weights()), "seed": opt.compression_stats().get("seed")}


def main():
    import horovod_ext.torch as hvd
    hvd.init()
    frameworks = os.environ.get("SEED_WORKER_FRAMEWORKS", "torch,keras").split(",")
    if "keras" in frameworks:
        import horovod_ext.tensorflow as hvd_tf
        hvd_tf.init()
    record = {"rank": hvd.rank()}
    for seed in SEEDS:
        record[str(seed)] = {f"{framework}/{method}": run(seed, method) for framework, run in
                             (("torch", run_torch), ("keras", run_keras)) if framework in frameworks
                             for method in METHODS}
    write_result(hvd.rank(), record)


if __name__ == "__main__":
    main()
