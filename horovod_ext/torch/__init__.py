"""horovod_ext.torch: a superset of horovod.torch.

``import horovod_ext.torch as hvd`` keeps everything of ``horovod.torch`` (init, rank, allreduce, broadcast_parameters,
...) and replaces ``Compression`` (adds ``ternary``) and ``DistributedOptimizer`` (carries payload compressors by
allgather, reports ``compression_stats()``, keeps its state in ``state_dict()``).
"""
from horovod.torch import *  # noqa: F401,F403  (everything of horovod.torch is still there)

from .compression import Compression  # noqa: E402
from .optimizer import DistributedOptimizer  # noqa: E402
