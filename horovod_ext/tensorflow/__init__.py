"""horovod_ext.tensorflow: a superset of horovod.tensorflow that works with TensorFlow 2.21 and Keras 3.

``import horovod_ext.tensorflow as hvd`` keeps everything of ``horovod.tensorflow`` and replaces ``Compression``
(adds ``ternary``) and ``DistributedGradientTape`` (works on Keras 3 variables; payload compressors by
allgather). For model.fit, see horovod_ext.tensorflow.keras.
"""
from horovod.tensorflow import *  # noqa: F401,F403  (everything of horovod.tensorflow is still there)

from .compression import Compression  # noqa: E402
from .gradient_tape import DistributedGradientTape  # noqa: E402
