"""hvd.Compression for TensorFlow: Horovod's none and fp16 (by allreduce) and horovod-ext's payload compressors
(by allgather), with the same names and arguments as in PyTorch (the specs are framework-free)."""
from horovod.tensorflow.compression import Compression as HorovodCompression

from horovod_ext.compression.specs import payload_compressors


class Compression(HorovodCompression):
    """Optional gradient compression algorithms used during allreduce / allgather."""

    none = HorovodCompression.none
    fp16 = HorovodCompression.fp16


for _name, _spec in payload_compressors().items():  # ternary, topk, adaptive_topk: the same specs in every framework
    setattr(Compression, _name, _spec)
