"""hx.Compression for DDP: none and fp16 (linear, by allreduce, as DDP's own default hook and torch's fp16 hook),
plus every compressor in horovod-ext's registry (ternary, topk, adaptive_topk, powersgd, auto and any registered
later): the same specs, with the same arguments, as hvd.Compression in horovod_ext.torch and horovod_ext.tensorflow."""
from horovod_ext.compression.registry import expose

from .backend import LinearCompressor


class Compression:
    """Gradient compressors for hx.CompressionState."""

    none = LinearCompressor("none")
    fp16 = LinearCompressor("fp16")


expose(Compression)
