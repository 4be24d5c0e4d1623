"""horovod-ext: communication-efficient training for Horovod.

``import horovod_ext.torch as hvd`` (a superset of ``horovod.torch``) gives ``hvd.Compression.ternary`` and a
``hvd.DistributedOptimizer`` that carries compressed payloads by allgather. See README.md and docs/.
"""
__version__ = "0.1.0"
