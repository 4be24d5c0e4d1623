"""What each method puts on the wire per step (framework-free): a list of collectives, sized by each transport's
own plan, so that the model's bytes are the bytes the statistics count (benchmarks/wire.py checks those against
real runs at 2 and 4 ranks).

A plan is [Transfer(kind, payload, wire, members, every)]: a `kind` collective of `payload` bytes per rank among
`members` ranks (None: all), `wire` bytes per rank on the wire, once every `every` steps (the periodic rounds of
LSGD and EASGD are averaged over their period). The payload compressors' plans take ``bucket_cap_mb`` (default 25,
as DistributedOptimizer's): a bucket's allgather carries its payloads' int32 sizes (compression/buckets.py).
"""
import math
from dataclasses import dataclass

from horovod_ext.compression.buckets import header_bytes
from horovod_ext.compression.join import JOIN_CHECK_BYTES
from horovod_ext.compressors.powersgd import PowerSGD
from horovod_ext.compressors.transports.sparse_reduce import planned_bytes as sparse_planned_bytes
from horovod_ext.compressors.transports.sparse_reduce import choose_transport as choose_topk_transport
from horovod_ext.compressors.ternary import FIXED_OF as TERNARY_FIXED_OF, Ternary
from horovod_ext.compressors.topk import TopK
from horovod_ext.compressors.transports.two_phase import TwoPhasePlan, choose_transport as choose_ternary_transport
from horovod_ext.compression.wire import allgather_wire_bytes, allreduce_wire_bytes, broadcast_wire_bytes
from horovod_ext.consensus import LeaderSync

TERNARY_MIN_SIZE = Ternary().min_size  # Compression.ternary's default: smaller tensors travel dense
TOPK_RATIO = TopK().ratio  # Compression.topk's default
POWERSGD = PowerSGD()  # Compression.powersgd's defaults


@dataclass(frozen=True)
class Transfer:
    kind: str
    payload: float
    wire: float
    members: int = None
    every: int = 1


def _allreduce(nbytes, n, **kw):
    return Transfer("allreduce", nbytes, allreduce_wire_bytes(nbytes, n), **kw)


def _allgather(nbytes, n, **kw):
    return Transfer("allgather", nbytes, allgather_wire_bytes(nbytes, n), **kw)


def _join_check(n):
    """Payload compressors' per-step check that every rank is still training (hvd.join)."""
    return _allreduce(JOIN_CHECK_BYTES, n)


def dense(sizes, n, **_):
    return [_allreduce(4 * sum(sizes), n)]


def fp16(sizes, n, **_):
    return [_allreduce(2 * sum(sizes), n)]


def ternary_transport(sizes, n, packing="base3", min_size=TERNARY_MIN_SIZE, transport="auto", shared_scale=None,
                      **_):
    """The transport Compression.ternary(transport=..., shared_scale=...) takes at n ranks: its own choice
    (two_phase.choose_transport: two-phase where it plans clearly fewer bytes per rank than allgather)."""
    return choose_ternary_transport(transport, shared_scale, [s for s in sizes if s >= min_size], n,
                                    TERNARY_FIXED_OF[packing])


def ternary(sizes, n, packing="base3", min_size=TERNARY_MIN_SIZE, bucket_cap_mb=25, transport="auto",
            shared_scale=None, **_):
    """TernGrad as Compression.ternary runs it at n ranks (ternary_transport): by allgather, every tensor's scale
    and packed codes (Ternary.payload_bytes; "entropy": its largest size) to every rank, with the buckets'
    headers; or two-phase (ternary_two_phase; with "entropy" the base-3 plan, its chunks' bound); small tensors
    dense."""
    if ternary_transport(sizes, n, packing, min_size, transport, shared_scale) == "two_phase":
        return ternary_two_phase(sizes, n, packing=TERNARY_FIXED_OF[packing], min_size=min_size)  # entropy: its bound
    spec = Ternary(packing=packing, min_size=min_size)
    big = [s for s in sizes if s >= min_size]
    small = 4 * sum(s for s in sizes if s < min_size)
    payload = sum(spec.payload_bytes(s) for s in big) + header_bytes(sizes, [s >= min_size for s in sizes],
                                                                      bucket_cap_mb)
    return [_allgather(payload, n), _allreduce(small, n), _join_check(n)]


def ternary_two_phase(sizes, n, packing="base3", min_size=TERNARY_MIN_SIZE, **_):
    """Two-phase ternary: an alltoall of code chunks, an allgather of the re-encoded chunk sums, and the
    allreduce(Max) of the shared scales; small tensors dense."""
    big = [s for s in sizes if s >= min_size]
    small = 4 * sum(s for s in sizes if s < min_size)
    plan = TwoPhasePlan(big, n, packing)
    sent = sum(s for j, s in enumerate(plan.send_splits) if j != 0)
    return [Transfer("alltoall", sum(plan.send_splits), sent),
            _allgather(plan.stream_sizes[0], n), _allreduce(4 * len(big), n), _allreduce(small, n), _join_check(n)]


def topk_transport(sizes, n, ratio=TOPK_RATIO, transport="auto", value_bits=16, **_):
    """The transport Compression.topk(transport=...) takes at n ranks: its own choice (sparse_reduce.choose_transport:
    sparse_reduce where it plans clearly fewer bytes per rank than allgather)."""
    return choose_topk_transport(transport, sizes, 1.0 / ratio, n, value_bits)


def topk(sizes, n, ratio=TOPK_RATIO, transport="auto", value_bits=16, bucket_cap_mb=25, **_):
    """Top-k with delta-coded indices as Compression.topk runs it at n ranks (topk_transport): by allgather (with
    the buckets' headers), or by sparse_reduce (alltoall, then allgather of the owners' selections), as
    compressors/transports/sparse_reduce.py plans them."""
    cf = 1.0 / ratio
    plan = sparse_planned_bytes(sizes, cf, n, value_bits)
    if topk_transport(sizes, n, ratio, transport, value_bits) == "sparse_reduce":
        alltoall, owners = plan["sparse_reduce_alltoall"], plan["sparse_reduce_allgather"]
        return [Transfer("alltoall", alltoall * n / max(n - 1, 1), alltoall),
                Transfer("allgather", owners / max(n - 1, 1), owners), _join_check(n)]
    payload = plan["allgather"] / max(n - 1, 1) + header_bytes(sizes, [True] * len(sizes), bucket_cap_mb)
    return [_allgather(payload, n), _join_check(n)]


def adaptive_topk(sizes, n, cf=10.0, **kw):
    """GraVAC at compression factor cf: top-k's transfers (its transport chosen at cf; the compressor chooses at
    its min_cf), and its controller's 32-byte allreduce."""
    return topk(sizes, n, ratio=1.0 / cf, **kw) + [_allreduce(32, n)]


def _leader_plan(sync, sizes, n, node_keys):
    """LSGD's transfers from LeaderSync's own schedule (due, transfer_levels), over one cycle of its longest
    period: the 16-byte loss exchange at every election, one broadcast per distinct transfer (rank 0's view)."""
    sync.configure(node_keys, 0)
    cycle = max(level.period for level in sync.levels)
    p = 4 * sum(sizes)
    out = []
    for step in range(1, cycle + 1):
        due = sync.due(step)
        if due:
            out.append(Transfer("allgather", 16, allgather_wire_bytes(16, n), every=cycle))
        for name, source in sync.transfer_levels(sync.levels_in(due)).items():
            if source.name == name:
                m = len(source.members)
                out.append(Transfer("broadcast", p, broadcast_wire_bytes(p, m), members=None if m == n else m,
                                    every=cycle))
    return out


def lsgd(sizes, n, period=4, **_):
    """Single-leader LSGD: per period, the 16-byte loss exchange and one broadcast of the leader's parameters."""
    return _leader_plan(LeaderSync(period=period, groups=None, size=n), sizes, n, ["node"] * n)


def multi_lsgd(sizes, n, period=4, global_period=16, ranks_per_node=None, **_):
    """Multi-leader LSGD, one group per node: the group leader's broadcast every period, the global leader's
    every global_period (one broadcast serves both where a node holds every rank)."""
    g = n if ranks_per_node is None else ranks_per_node
    sync = LeaderSync(period=period, global_period=global_period, groups="node", size=n)
    return _leader_plan(sync, sizes, n, [f"node{r // g}" for r in range(n)])


def easgd(sizes, n, period=4, **_):
    p = 4 * sum(sizes)
    return [_allreduce(p, n, every=period)]


def powersgd(shapes, n, rank=POWERSGD.rank, min_compression_rate=POWERSGD.min_compression_rate,
             value_dtype=POWERSGD.value_dtype, hook=False, **_):
    """Compression.powersgd once compressing (from start_iter): P (n x r) and Q (m x r) of every matrix
    (PowerSGD.layout and factor_bytes; the hook's _should_compress) in one allreduce each, the tensors that go dense by
    allreduce, and the join check. hook=True: PyTorch's DDP hook (benchmarks/baselines.py counts with it): the same
    factors, fp32, in one allreduce with the dense tensors, no join check."""
    spec = PowerSGD(rank=rank, min_compression_rate=min_compression_rate, value_dtype=value_dtype)
    p = q = dense = 0
    for shape in shapes:
        layout = spec.layout(shape)
        if layout is None:
            dense += spec.payload_bytes(shape)
        else:
            p_bytes, q_bytes = spec.factor_bytes(layout)
            p, q = p + p_bytes, q + q_bytes
    if hook:
        return [_allreduce(p + q + dense, n)]
    return [_allreduce(p, n), _allreduce(q, n), _allreduce(dense, n), _join_check(n)]


# name -> (plan of (shapes or sizes, ranks, **arguments), whether it needs shapes)
METHODS = {"dense": (dense, False), "fp16": (fp16, False), "ternary": (ternary, False),
           "ternary_two_phase": (ternary_two_phase, False), "topk": (topk, False),
           "topk_sparse_reduce": (lambda s, n, **kw: topk(s, n, transport="sparse_reduce", **kw), False),
           "adaptive_topk": (adaptive_topk, False), "lsgd": (lsgd, False), "multi_lsgd": (multi_lsgd, False),
           "easgd": (easgd, False), "powersgd": (powersgd, True)}


def sizes_of(shapes):
    """Elements per tensor of shapes given as tuples (or lists) or as sizes."""
    return [math.prod(s) if isinstance(s, (tuple, list)) else int(s) for s in shapes]


# method -> its transport's choice, and the plan of each transport it can take
TRANSPORTS = {"ternary": (ternary_transport, {"two_phase": "ternary_two_phase"}),
              "topk": (topk_transport, {"sparse_reduce": "topk_sparse_reduce"}),
              "adaptive_topk": (lambda s, n, cf=10.0, **kw: topk_transport(s, n, ratio=1.0 / cf, **kw),
                                {"sparse_reduce": "adaptive_topk_sparse_reduce"})}


def transport_of(method, shapes, ranks, **arguments):
    """(transport, the name its kernels' throughput is listed under) of `method` at `ranks` ranks: the payload
    compressors' "auto" choice (or the transport= given); (None, method) for the others."""
    if method not in TRANSPORTS:
        return None, method
    choose, names = TRANSPORTS[method]
    transport = choose(sizes_of(shapes), ranks, **arguments)
    return transport, names.get(transport, method)


def plan(method, shapes, ranks, **arguments):
    """The transfers of one step of `method` for tensors of `shapes` at `ranks` ranks."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    fn, needs_shapes = METHODS[method]
    shapes = [tuple(int(d) for d in s) for s in shapes]
    return fn(shapes if needs_shapes else [math.prod(s) for s in shapes], ranks, **arguments)


def wire_bytes_per_step(transfers):
    """Mean bytes a rank puts on the wire per step."""
    return sum(t.wire / t.every for t in transfers)
