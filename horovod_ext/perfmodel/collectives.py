"""Time of one collective on a cluster: the alpha-beta model (Hockney), per algorithm Horovod runs (framework-free).

A link moves b bytes in alpha + b / beta seconds (alpha: latency, beta: bandwidth in bytes/s). For N ranks and a
per-rank payload of b bytes (Thakur, Rabenseifner and Gropp 2005; the byte factors are horovod_ext.compression.wire's):

    ring allreduce      2 (N-1) alpha + 2 (N-1)/N * b / beta
    ring allgather        (N-1) alpha +   (N-1)   * b / beta
    alltoall              (N-1) alpha +   (N-1)/N * b / beta
    broadcast, "root"     (N-1) alpha +   (N-1)   * b / beta     (gloo: the root sends a copy to each rank)
    broadcast, "pipeline" (N-1) alpha +             b / beta     (NCCL, MPI: chunks forwarded along a chain)

Where ranks sit on several nodes (ranks_per_node G < N), a flat ring crosses nodes, so its steps run at the
inter-node link's alpha and beta. Hierarchical allreduce and allgather (Horovod's HOROVOD_HIERARCHICAL_*) run the
ring inside each node on the intra-node link and across the M = N/G nodes on the inter-node link, where a node's G
ranks share its link: allreduce 2 (G-1) alpha_i + 2 (G-1)/G b / beta_i + 2 (M-1) alpha_e + 2 (M-1)/M b / beta_e.

shared=True is one medium for every rank (the benchmarks' shaped loopback, a hub): the bytes of all ranks cross the
same link one after another, so the bandwidth term is the sum over ranks of the bytes each puts on the wire.
"""
import math
from dataclasses import dataclass

from horovod_ext.compression.wire import (allgather_wire_bytes, allreduce_wire_bytes, alltoall_wire_bytes,
                                          broadcast_wire_bytes)

KINDS = ("allreduce", "allgather", "alltoall", "broadcast")
WIRE_BYTES = {"allreduce": allreduce_wire_bytes, "allgather": allgather_wire_bytes,
              "alltoall": alltoall_wire_bytes, "broadcast": broadcast_wire_bytes}
BROADCASTS = ("pipeline", "root")  # NCCL/MPI's pipelined broadcast, gloo's root-sends-every-copy
LATENCY_STEPS = {"allreduce": lambda n: 2 * (n - 1), "allgather": lambda n: n - 1, "alltoall": lambda n: n - 1,
                 "broadcast": lambda n: n - 1}


@dataclass(frozen=True)
class Link:
    """A link: bandwidth in Gbit/s (math.inf for an ideal one) and latency in seconds per message."""
    gbit: float
    latency: float = 0.0

    def __post_init__(self):
        if not (isinstance(self.gbit, (int, float)) and self.gbit > 0):
            raise ValueError(f"Link: gbit must be a bandwidth > 0 in Gbit/s (math.inf for an ideal link), "
                             f"got {self.gbit!r}")
        if not (isinstance(self.latency, (int, float)) and self.latency >= 0 and math.isfinite(self.latency)):
            raise ValueError(f"Link: latency must be seconds >= 0, got {self.latency!r}")

    @property
    def bytes_per_second(self):
        return self.gbit * 1e9 / 8


@dataclass(frozen=True)
class Cluster:
    """ranks, ranks_per_node (a divisor of ranks; default all on one node), the links inside a node and between
    nodes, whether the collectives are hierarchical, and whether every rank shares one medium."""
    ranks: int
    inter: Link
    intra: Link = None
    ranks_per_node: int = None
    hierarchical: bool = False
    shared: bool = False
    broadcast: str = "pipeline"

    def __post_init__(self):
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 1:
            raise ValueError(f"Cluster: ranks must be an integer >= 1, got {self.ranks!r}")
        per_node = self.ranks if self.ranks_per_node is None else self.ranks_per_node
        if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1 or self.ranks % per_node:
            raise ValueError(f"Cluster: ranks_per_node must divide ranks ({self.ranks}), got {self.ranks_per_node!r}")
        object.__setattr__(self, "ranks_per_node", per_node)
        if self.broadcast not in BROADCASTS:
            raise ValueError(f"Cluster: broadcast must be one of {list(BROADCASTS)}, got {self.broadcast!r}")
        object.__setattr__(self, "intra", self.intra or self.inter)

    @property
    def nodes(self):
        return self.ranks // self.ranks_per_node


def _flat(kind, nbytes, n, link, shared, wire=None, broadcast="pipeline"):
    """A flat algorithm over n ranks on one kind of link. wire: the bytes per rank (averaged over the ranks) when
    a transport's plan counts them exactly; by default the formula's."""
    if n < 2:
        return 0.0
    wire = WIRE_BYTES[kind](nbytes, n) if wire is None else wire
    if shared:  # one medium: every rank's bytes cross it
        on_link = n * wire
    elif kind == "broadcast":  # the root sends every copy (gloo), or each rank forwards one (pipeline)
        on_link = n * wire if broadcast == "root" else n * wire / (n - 1)
    else:
        on_link = wire
    return LATENCY_STEPS[kind](n) * link.latency + on_link / link.bytes_per_second


def seconds(kind, nbytes, cluster, members=None, wire=None):
    """Seconds of one `kind` collective of `nbytes` per rank among `members` ranks (default every rank; a group
    of at most ranks_per_node is taken to sit inside one node). wire: a plan's exact bytes per rank, used by the
    flat algorithms in place of the formula's."""
    if kind not in KINDS:
        raise ValueError(f"collective kind must be one of {list(KINDS)}, got {kind!r}")
    n = cluster.ranks if members is None else members
    if n <= cluster.ranks_per_node:
        return _flat(kind, nbytes, n, cluster.intra, cluster.shared, wire, cluster.broadcast)
    per_node, nodes = cluster.ranks_per_node, n // cluster.ranks_per_node
    if cluster.hierarchical and kind in ("allreduce", "allgather") and per_node > 1:
        # inside every node at once: on a shared medium the nodes' rings add up
        inside_scale = nodes if cluster.shared else 1
        if kind == "allreduce":  # reduce-scatter and allgather in the node; a node's G shares cross its link
            inside = _flat("allreduce", nbytes, per_node, cluster.intra, cluster.shared) * inside_scale
            return inside + _flat("allreduce", nbytes, nodes, cluster.inter, cluster.shared)
        gathered = nbytes * per_node  # a node's payloads, gathered inside it, cross as one block
        inside = (_flat("allgather", nbytes, per_node, cluster.intra, cluster.shared)
                  + _flat("broadcast", gathered * (nodes - 1), per_node, cluster.intra, cluster.shared,
                          broadcast=cluster.broadcast)) * inside_scale
        return inside + _flat("allgather", gathered, nodes, cluster.inter, cluster.shared)
    return _flat(kind, nbytes, n, cluster.inter, cluster.shared, wire, cluster.broadcast)
