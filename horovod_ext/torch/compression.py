"""hvd.Compression for PyTorch: Horovod's none and fp16 (linear, by allreduce), plus horovod-ext's payload
compressors (by allgather). Each is usable bare (defaults) or called with arguments:
``Compression.ternary`` or ``Compression.ternary(clip=2.5, shared_scale=False, packing="base3", min_size=1024,
seed=None)``; ``Compression.topk(ratio=0.01, error_feedback=True, value_dtype="fp16")``;
``Compression.adaptive_topk(min_cf=10, max_cf=1000, epsilon=0.9, window=500, omega=0.01, policy="exponential")``."""
from horovod.torch.compression import Compression as HorovodCompression

from horovod_ext.compression.registry import expose


class Compression(HorovodCompression):
    """Optional gradient compression algorithms used during allreduce / allgather."""

    none = HorovodCompression.none
    fp16 = HorovodCompression.fp16


expose(Compression)  # ternary, topk, adaptive_topk and any registered later: the same specs in every framework
