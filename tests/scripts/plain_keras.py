"""A plain Horovod Keras script as Horovod's examples write it: no horovod_ext anywhere. Under Keras 3 Horovod's
own DistributedOptimizer fails; under `python -m horovod_ext.run` it resolves to horovod_ext's."""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402

import horovod.tensorflow.keras as hvd  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()

hvd.init()
keras.utils.set_random_seed(hvd.rank())
x = np.random.default_rng(hvd.rank()).standard_normal((32 * args.steps, 64)).astype(np.float32)
y = np.argmax(x[:, :10], axis=1)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9))
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, y, batch_size=32, epochs=1, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
if hvd.rank() == 0:
    print(f"plain_keras: final loss {history.history['loss'][-1]:.4f}")
