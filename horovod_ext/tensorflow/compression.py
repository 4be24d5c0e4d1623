"""hvd.Compression for TensorFlow: Horovod's none and fp16 (by allreduce) and horovod-ext's payload compressors
(by allgather), with the same names and arguments as in PyTorch (the specs are framework-free)."""
from horovod.tensorflow.compression import Compression as HorovodCompression

from horovod_ext.compression.registry import expose


class Compression(HorovodCompression):
    """Optional gradient compression algorithms used during allreduce / allgather."""

    none = HorovodCompression.none
    fp16 = HorovodCompression.fp16


expose(Compression)  # ternary, topk, adaptive_topk and any registered later: the same specs in every framework
