"""hvd.Compression for PyTorch: Horovod's none and fp16 (linear, by allreduce), plus horovod-ext's payload
compressors (by allgather). Each is usable bare (defaults) or called with arguments:
``Compression.ternary`` or ``Compression.ternary(clip=2.5, shared_scale=False, packing="base3", min_size=1024,
seed=None)``."""
from horovod.torch.compression import Compression as HorovodCompression

from horovod_ext.compression.specs import Ternary


class Compression(HorovodCompression):
    """Optional gradient compression algorithms used during allreduce / allgather."""

    none = HorovodCompression.none
    fp16 = HorovodCompression.fp16
    ternary = Ternary()
