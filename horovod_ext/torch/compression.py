"""hvd.Compression for PyTorch: Horovod's none and fp16 (linear, by allreduce), plus every compressor in horovod-ext's
registry (horovod_ext.compression.registry: ternary, topk, adaptive_topk, powersgd, auto, and any registered later),
the same specs as in TensorFlow. Each is usable bare (defaults) or called with arguments, e.g.
``Compression.ternary(clip=2.5)``, ``Compression.topk(ratio=0.01)``, ``Compression.adaptive_topk()``; their arguments
are documented on their specs (horovod_ext/compressors/: ternary.py, topk.py, gravac.py, powersgd.py, auto/)."""
from horovod.torch.compression import Compression as HorovodCompression

from horovod_ext.compression.registry import expose


class Compression(HorovodCompression):
    """Optional gradient compression algorithms used during allreduce / allgather."""

    none = HorovodCompression.none
    fp16 = HorovodCompression.fp16


expose(Compression)  # ternary, topk, adaptive_topk and any registered later: the same specs in every framework
