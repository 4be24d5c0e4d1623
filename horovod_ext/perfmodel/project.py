"""From a running job to other scales (framework-free): the job's compression_stats() give its step time and the
seconds it spent on communication and compression; what is left is compute, which does not change with the number
of ranks at a fixed batch per rank. perfmodel then predicts every method's step at other ranks and links."""
import math

from .collectives import Cluster, Link
from .plans import METHODS
from .predict import predict

DEFAULT_LATENCY = 50e-6  # seconds per message on a data-centre Ethernet link (TCP); pass yours


def shapes_of(model):
    """The tensor shapes a model trains: a torch.nn.Module (parameters that require grad), a Keras model or layer
    (trainable_weights), or a list of shapes (tuples) or sizes (ints)."""
    if callable(getattr(model, "parameters", None)):
        return [tuple(p.shape) for p in model.parameters() if p.requires_grad]
    if hasattr(model, "trainable_weights"):
        return [tuple(int(d) for d in w.shape) for w in model.trainable_weights]
    try:
        return [(int(s),) if not isinstance(s, (tuple, list)) else tuple(int(d) for d in s) for s in model]
    except (TypeError, ValueError):
        raise ValueError(f"model must be a torch.nn.Module, a Keras model or a list of tensor shapes or sizes; "
                         f"got {type(model).__name__}") from None


def compute_seconds_of(stats):
    """A job's compute per step: compression_stats()["compute_seconds"], the median over its recent steps of the
    step's wall-clock interval less the seconds that step spent compressing, decompressing and waiting on
    communication."""
    compute = stats.get("compute_seconds")
    if compute is None:
        raise ValueError("project needs a job that has taken at least two steps with measured seconds "
                         "(compression_stats()['compute_seconds'] is None); or pass compute_seconds")
    return compute


def project(shapes, stats, ranks, gbit, latency=DEFAULT_LATENCY, ranks_per_node=None, intra_gbit=None,
            methods=None, compute_seconds=None, overlap=0.0, hierarchical=False,
            overhead_seconds=0.0):
    """{method: Prediction} at `ranks` ranks on `gbit` Gbit/s links (inter-node; intra_gbit inside a node,
    default the same), from a job's tensor shapes and compression_stats(). methods: default every one.
    overhead_seconds: a per-step software cost added to every method (predict.py), e.g. the job's own step on its
    link less its compute and the communication the model gives that link; it is the job's method's, and others'
    differ (benchmarks/RESULTS.md, section "Performance model validation")."""
    compute = compute_seconds_of(stats) if compute_seconds is None else compute_seconds
    intra = Link(intra_gbit, latency) if intra_gbit is not None else None
    cluster = Cluster(ranks, Link(gbit, latency), intra=intra, ranks_per_node=ranks_per_node,
                      hierarchical=hierarchical)
    names = sorted(METHODS) if methods is None else list(methods)
    return {name: predict(name, shapes, compute, cluster, overlap=overlap, overhead_seconds=overhead_seconds)
            for name in names}


def table(predictions):
    """Rows of (method, step ms, speed-up over dense, over fp16, MB on the wire per rank per step)."""
    return [(name, p.step_seconds * 1e3, p.speedup_over_dense, p.speedup_over_fp16, p.wire_bytes / 1e6)
            for name, p in sorted(predictions.items(), key=lambda item: item[1].step_seconds)
            if math.isfinite(p.step_seconds)]
