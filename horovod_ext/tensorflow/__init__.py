"""horovod_ext.tensorflow: a superset of horovod.tensorflow that works with TensorFlow 2.21 and Keras 3.

``import horovod_ext.tensorflow as hvd`` keeps everything of ``horovod.tensorflow`` and replaces ``Compression``
(adds ``ternary``) and ``DistributedGradientTape`` (works on Keras 3 variables; payload compressors by
allgather), adds LeaderOptimizer (LSGD), ElasticAveragingOptimizer (EASGD) and DiLoCoOptimizer for Keras 3
optimizers, and makes ``init`` enable dynamic process sets. For model.fit, see horovod_ext.tensorflow.keras.
"""
import horovod.tensorflow as _horovod
from horovod.tensorflow import *  # noqa: F401,F403  (everything of horovod.tensorflow is still there)

from horovod_ext.consensus.init import make_init  # noqa: E402
from horovod_ext.horovod_internals import framework_basics  # noqa: E402

from .compression import Compression  # noqa: E402,F401  (re-exported)
from .diloco import DiLoCoOptimizer  # noqa: E402,F401  (re-exported)
from .gradient_tape import DistributedGradientTape  # noqa: E402,F401  (re-exported)
from .leader import ElasticAveragingOptimizer, LeaderOptimizer  # noqa: E402,F401  (re-exported)
from .project import project  # noqa: E402,F401  (re-exported)

init = make_init(_horovod.init, framework_basics(_horovod))
