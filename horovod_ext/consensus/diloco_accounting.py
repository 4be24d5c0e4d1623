"""What a DiLoCoOptimizer puts on the wire, counted per rank by wire.py's formulas (framework-free; the PyTorch
and TensorFlow adapters both report through it, so their figures are the same).

With N ranks, L workers (their leaders), G the ranks of this rank's worker and b_p the float32 bytes of fragment p:

    start     rank 0's parameters (B bytes, in their own dtypes), one broadcast over every rank at the first step:
              payload B on rank 0, wire (N-1)/N * B on every rank
    exchange  each round's pseudo-gradients through the plan, over the leaders (the plan's own count, in the
              optimizer's statistics, with data-parallel SGD's dense reference of every step)
    election  outer="leader": the (loss sum, count, 1) float64 table, 24 N bytes, one allreduce over every rank:
              wire 2 (N-1)/N * 24 N
    transfer  outer="leader": the elected leader's buffer of n bytes, one allreduce over the leaders when a rank has
              joined (wire 2 (L-1)/L * n), else one allgather to which only it contributes (wire (L-1) * n)
    inner     with groups: every inner step's gradients averaged over the worker through inner_compression's plan
              (the plan's own count, over the G ranks)
    share     with groups: at each exchange started, the leader's broadcast of fragment p's average to its worker:
              payload b_p on the leader, wire (G-1)/G * b_p on every rank of the worker

total = exchange (+ election + transfer) + inner + share + start: every collective this rank takes part in.
"""
from horovod_ext.compression.stats import CompressionStats
from horovod_ext.compression.wire import allgather_wire_bytes, allreduce_wire_bytes, broadcast_wire_bytes

BYTES = ("payload_bytes", "wire_bytes")


def counts(payload_bytes, wire_bytes):
    return {"payload_bytes": payload_bytes, "wire_bytes": wire_bytes}


def start_counts(param_bytes, nranks, rank):
    """The start's broadcast of rank 0's B = param_bytes: payload B on rank 0 (none at one rank), wire (N-1)/N * B
    on every rank."""
    return counts(param_bytes if rank == 0 and nranks > 1 else 0, broadcast_wire_bytes(param_bytes, nranks))


def election_bytes(size):
    """The bytes of outer="leader"'s election table: (loss sum, count, 1) in float64 per rank, 24 N."""
    return 24 * size


def election_counts(size):
    """One election: payload 24 N, wire 2 (N-1)/N * 24 N (one allreduce over every rank)."""
    nbytes = election_bytes(size)
    return counts(nbytes, allreduce_wire_bytes(nbytes, size))


def transfer_wire_per_byte(kind, nleaders):
    """outer="leader"'s transfer, wire bytes per byte the elected leader sends (a Python float, so that a graph can
    multiply its byte count by it): kind "dense" (one allreduce over the L leaders) 2 (L-1)/L, else (one allgather
    that only the elected leader contributes to) L - 1."""
    return allreduce_wire_bytes(1.0, nleaders) if kind == "dense" else allgather_wire_bytes(1.0, nleaders)


def exchanges_started(schedule, inner):
    """Per fragment, the exchanges started within `inner` inner steps: k = inner // w in all (w = H / P), fragment
    p's are the j < k with j mod P = p (consensus.diloco.Schedule)."""
    k = inner // schedule.window
    return [len(range(p, k, schedule.fragments)) for p in range(schedule.fragments)]


def share_counts(settings, fragment_bytes, started):
    """The leader's broadcasts of the exchanges' averages to its worker of G ranks, S = sum_p started[p] * b_p
    (fragment_bytes[p] = b_p, float32): payload S on the leader (0 on the others, and with G = 1), wire (G-1)/G * S
    on every rank of the worker."""
    nbytes = sum(n * b for n, b in zip(started, fragment_bytes))
    size = len(settings.group)
    return counts(nbytes if settings.is_leader and size > 1 else 0, broadcast_wire_bytes(nbytes, size))


def _plus(summary, *parts, nranks=None):
    """A statistics summary's raw fields plus the payload and wire bytes of `parts`, summarized again (the ratios
    follow the new totals); with nranks, dense_wire_bytes = 2 (N-1)/N * dense_bytes, data-parallel SGD's ring
    allreduce over the N ranks."""
    raw = {k: v for k, v in summary.items() if k not in ("bits_per_element", "ratio", "wire_ratio")}
    for part in parts:
        for key in BYTES:
            raw[key] += part[key]
    if nranks is not None:
        raw["dense_wire_bytes"] = allreduce_wire_bytes(raw["dense_bytes"], nranks)
    return CompressionStats._summary(raw)  # noqa: SLF001


def report(stats, nranks, start, inner=None, share=None):
    """The optimizer's compression_stats() with every collective in it. `stats`: the exchange's statistics
    (as_dict form: its total and last_step count the exchange, the elections and transfers, and the dense reference
    of every step); `inner`: the in-group plan's (as_dict form) or None without groups; `start`, `share`: counts().

    Sets stats["exchange"] (the exchange's payload and wire bytes alone), stats["start"], stats["inner"] (the
    in-group plan's statistics, its total with the share added); stats["total"] = exchange + inner + share + start
    and stats["last_step"] = the exchange's last step + the in-group plan's (the start and the shares are counted
    in the totals only). The dense reference is data-parallel SGD's over the N = nranks ranks: dense_bytes as counted,
    dense_wire_bytes = 2 (N-1)/N * dense_bytes (the exchange's plan counts the steps it sent over the leaders' process
    set, of L ranks)."""
    stats["exchange"] = counts(stats["total"]["payload_bytes"], stats["total"]["wire_bytes"])
    stats["start"] = dict(start)
    parts, last = [start], []
    if inner is not None:
        inner["total"] = _plus(inner["total"], share)
        stats["inner"] = inner
        parts.append(inner["total"])
        last.append(inner["last_step"])
    stats["total"] = _plus(stats["total"], *parts, nranks=nranks)
    stats["last_step"] = _plus(stats["last_step"], *last, nranks=nranks)
    return stats
