"""The payload compressors, framework-free, one module per method over the shared step core (horovod_ext.compression):
each declares its spec (arguments and checks), its codec (the kernels and payload sizes of one tensor) and its method
(the plan of a step), and both frameworks run it unchanged.

- ternary.py: TernGrad (Compression.ternary), by allgather or two-phase;
- topk.py: top-k with error feedback (Compression.topk), by allgather or sparse_reduce;
- gravac.py: adaptive top-k, GraVAC's controller (Compression.adaptive_topk), by the same transports as top-k;
- powersgd.py: PowerSGD (Compression.powersgd), its factors by allreduce;
- auto/: Compression.auto, which measures the link and the candidates and picks one per tensor (``__init__``: the
  spec; choice.py: the step model and solver; measure.py: the measurements; method.py: the method);
- transports/: the aggregation schemes a method may pick, which are not methods themselves: two_phase.py (ternary's
  alltoall + allgather of chunk sums) and sparse_reduce.py (top-k's and adaptive top-k's sparse allreduce).

Importing this package registers the built-in compressors (BUILTINS, in this order: both frameworks'
hvd.Compression and the launcher list them so) in horovod_ext.compression.registry.
"""
from horovod_ext.compression.registry import register

from .ternary import Ternary
from .topk import TopK
from .gravac import AdaptiveTopK
from .powersgd import PowerSGD
from .auto import Auto

BUILTINS = (Ternary(), TopK(), AdaptiveTopK(), PowerSGD(), Auto())
for _spec in BUILTINS:
    register(_spec)

__all__ = ["Ternary", "TopK", "AdaptiveTopK", "PowerSGD", "Auto", "BUILTINS"]
