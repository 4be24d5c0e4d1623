"""horovod_ext.tensorflow.keras: Horovod's Keras API for Keras 3 (TensorFlow 2.21), where Horovod's own
DistributedOptimizer and callbacks target the Keras 2 optimizer API.

    import horovod_ext.tensorflow.keras as hvd
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                  compression=hvd.Compression.ternary), loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

On a machine with a GPU, compile with ``jit_compile=False``: Horovod's ops have no XLA lowering (Keras turns
XLA off on CPU-only machines by itself).
"""
import importlib

from horovod.tensorflow.keras import *  # noqa: F401,F403  (everything of horovod.tensorflow.keras is still there)

import horovod.tensorflow as _horovod  # noqa: E402
from horovod_ext.consensus.init import make_init  # noqa: E402
from horovod_ext.horovod_internals import framework_basics  # noqa: E402
from horovod_ext.tensorflow.compression import Compression  # noqa: E402,F401  (re-exported)
from horovod_ext.tensorflow.diloco import DiLoCoOptimizer  # noqa: E402,F401  (re-exported)
from horovod_ext.tensorflow.leader import ElasticAveragingOptimizer, LeaderOptimizer  # noqa: E402,F401  (re-exported)
from horovod_ext.tensorflow.project import project  # noqa: E402,F401  (re-exported)
from .optimizer import DistributedOptimizer  # noqa: E402,F401  (re-exported)

# `from . import callbacks` would return the `callbacks` the star import bound (Horovod's, for Keras 2).
callbacks = importlib.import_module(".callbacks", __name__)
elastic = importlib.import_module(".elastic", __name__)  # Horovod's elastic Keras API, for Keras 3
init = make_init(_horovod.init, framework_basics(_horovod))
