"""DiLoCoOptimizer's counted bytes under horovodrun -np 2 -H localhost:2 (tests/test_diloco_wire.py): argv[1]
"torch" or "keras". groups="node" makes the two ranks one worker; a Linear(8, 4) (36 float32 parameters) takes
ROUNDS rounds of H inner steps with dense exchanges (Compression.none, inside and across). Each rank reports
compression_stats()'s total, exchange, start and inner (payload and wire bytes), its workers and whether it leads."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from hvdrun import write_result  # noqa: E402

FRAMEWORK = sys.argv[1]
H, ROUNDS = 3, 2
KEYS = ("payload_bytes", "wire_bytes", "dense_bytes", "dense_wire_bytes")


def data(rank):
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(16, 8)).astype(np.float32)
    return x, (x @ np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(8, 4)).astype(np.float32)


def torch_stats():
    import torch

    import horovod_ext.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = hvd.DiLoCoOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                              inner_steps=H, groups="node")
    x, y = map(torch.from_numpy, data(hvd.rank()))
    for _ in range(ROUNDS * H):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return hvd.rank(), opt.compression_stats()


def keras_stats():
    import keras
    import tensorflow as tf

    import horovod_ext.tensorflow.keras as hvd
    hvd.init()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="linear")])
    opt = hvd.DiLoCoOptimizer(keras.optimizers.SGD(0.05), inner_steps=H, groups="node")
    x, y = data(hvd.rank())
    for _ in range(ROUNDS * H):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return hvd.rank(), opt.compression_stats()


rank, stats = torch_stats() if FRAMEWORK == "torch" else keras_stats()
write_result(rank, {"rank": rank, "workers": stats["workers"], "leader": stats["leader"],
                    "total": {k: stats["total"][k] for k in KEYS},
                    "exchange": stats["exchange"], "start": stats["start"],
                    "inner": {k: stats["inner"]["total"][k] for k in KEYS}})
