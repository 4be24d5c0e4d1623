"""Step time of a method on a cluster (framework-free): TernGrad's performance model, with each transport's byte
plan and the alpha-beta time of its collectives.

    step = compute + overhead + max(0, communication + compression - overlap * compute)

communication is the sum over the step's collectives (plans.py) of their alpha-beta time (collectives.py), each
periodic one divided by its period; compression is the seconds the method's kernels take per step (measured, or
from the kernels' throughput: THROUGHPUT); overlap is the fraction of compute that communication can run behind
(Horovod starts a gradient's collective during backward: about backward's share for allreduce and allgather
methods; 0 measures the worst case); overhead is the per-step cost none of these terms hold: the framework's and
Horovod's own work per step (negotiating each collective, the background thread's cycle, copies into the fusion
buffer), which on a loaded host can exceed alpha's share. It is 0 unless measured: a method's step on a fast link
less its compute, compression and the communication predicted for that link. Speed-ups compare with dense (float32
allreduce) and fp16 on the same cluster, compute and overhead.
"""
from dataclasses import dataclass, field

from .collectives import seconds
from .plans import plan, sizes_of, transport_of, wire_bytes_per_step

# Kernel throughput, elements per second on one CPU thread of the CI machine (benchmarks/RESULTS.md, section
# "kernels", 1-4M elements): (encode, decode of one payload, payloads a rank decodes per step: "ranks" or 1). Pass
# compression_seconds where yours differ (a GPU, or other sizes).
THROUGHPUT = {"ternary": (0.42e9, 1.1e9, "ranks"),              # base-3 encode and decode, fp32 elements
              "ternary_two_phase": (0.42e9, 1.1e9, 1),         # one re-encoded stream of chunk sums
              "topk": (0.65e9, 4e9, "ranks"),                  # encode: selection at 1%; decode: sparse adds
              "topk_sparse_reduce": (0.65e9, 4e9, 1),
              "adaptive_topk": (0.65e9, 4e9, "ranks"),
              "adaptive_topk_sparse_reduce": (0.65e9, 4e9, 1)}


def compression_seconds_of(method, elements, ranks, kernel_speedup=1.0):
    """Seconds a rank spends in the method's kernels per step, from THROUGHPUT divided by kernel_speedup (how much
    faster your kernels run than one CPU thread of the CI machine; 0 for methods without kernels)."""
    if method not in THROUGHPUT:
        return 0.0
    encode, decode, payloads = THROUGHPUT[method]
    return (elements / encode + (ranks if payloads == "ranks" else payloads) * elements / decode) / kernel_speedup


@dataclass
class Prediction:
    method: str
    ranks: int
    step_seconds: float
    compute_seconds: float
    communication_seconds: float
    compression_seconds: float
    wire_bytes: float
    transfers: list = field(default_factory=list)  # [{kind, members, every, wire_bytes, seconds}]
    overhead_seconds: float = 0.0
    speedup_over_dense: float = None
    speedup_over_fp16: float = None
    transport: str = None  # a payload compressor's transport at these ranks (plans.transport_of), else None


def _check_seconds(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be seconds >= 0, got {value!r}")
    return float(value)


def step_of(method, shapes, compute_seconds, cluster, compression_seconds=None, overlap=0.0, kernel_speedup=1.0,
            overhead_seconds=0.0, **arguments):
    """The Prediction of one method, without speed-ups. compression_seconds: None takes THROUGHPUT's."""
    compute = _check_seconds("compute_seconds", compute_seconds)
    overhead = _check_seconds("overhead_seconds", overhead_seconds)
    transport, kernels = transport_of(method, shapes, cluster.ranks, **arguments)
    if compression_seconds is None:
        elements = sum(sizes_of(shapes))
        compression_seconds = compression_seconds_of(kernels, elements, cluster.ranks, kernel_speedup)
    compression = _check_seconds("compression_seconds", compression_seconds)
    if isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be a fraction of compute in [0, 1], got {overlap!r}")
    if method == "multi_lsgd":
        arguments.setdefault("ranks_per_node", cluster.ranks_per_node)
    transfers = plan(method, shapes, cluster.ranks, **arguments)
    rows = [{"kind": t.kind, "members": t.members or cluster.ranks, "every": t.every, "wire_bytes": t.wire,
             "seconds": seconds(t.kind, t.payload, cluster, t.members, wire=t.wire) / t.every} for t in transfers]
    communication = sum(r["seconds"] for r in rows)
    step = compute + overhead + max(0.0, communication + compression - overlap * compute)
    return Prediction(method, cluster.ranks, step, compute, communication, compression,
                      wire_bytes_per_step(transfers), rows, overhead, transport=transport)


def predict(method, shapes, compute_seconds, cluster, compression_seconds=None, overlap=0.0, kernel_speedup=1.0,
            overhead_seconds=0.0, **arguments):
    """The step time of `method` for a model with tensors of `shapes` (tuples; or sizes), `compute_seconds` of
    forward and backward per step, on `cluster`, with its speed-up over dense and over fp16 (which take the same
    overhead_seconds; where theirs is measured apart, compare step_of's Predictions)."""
    out = step_of(method, shapes, compute_seconds, cluster, compression_seconds, overlap, kernel_speedup,
                  overhead_seconds, **arguments)
    for baseline in ("dense", "fp16"):
        base = step_of(baseline, shapes, compute_seconds, cluster, 0.0, overlap, overhead_seconds=overhead_seconds)
        setattr(out, f"speedup_over_{baseline}", base.step_seconds / out.step_seconds if out.step_seconds else None)
    return out
