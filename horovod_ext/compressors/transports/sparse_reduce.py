"""transport="sparse_reduce" of top-k and adaptive top-k: aggregation whose bytes per rank do not grow with the
number of ranks (Ok-Topk's sparse allreduce: Li & Hoefler, "Near-Optimal Sparse Allreduce for Distributed Deep
Learning", PPoPP 2022), written once for both adapters. The definition, to the bit, is
python/hvdext_reference/sparse_reduce.py.

The step's compressed tensors, in parameter order, form one index space [0, T). Each rank selects per tensor as
top-k does (k_t of g_ef = g + r), K = sum_t k_t entries at ascending positions I. The space is cut into P regions
[B_j, B_{j+1}), rank j owning region j:

1. one alltoall: each rank sends owner j its entries in region j (a "delta" payload over the region, possibly
   empty), keeping remainder = g_ef - sent as top-k does;
2. owner j sums what it received exactly as top-k's decode does (float32, in rank order, at the positions it
   received: O(K log K), never a dense buffer of its region), and keeps the q = ceil(K / P) entries of largest |sum|
   (top-k's order and ties; all of them where it received fewer): the global selection, about K entries in all;
3. one allgather of the owners' payloads; every rank decodes them at their regions' offsets: avg = sum / divisor;
4. error feedback: r = remainder where avg != 0, g_ef where avg == 0 -- what a rank sent but the global selection
   dropped goes back into its residual, so sum over ranks of (applied + r) == sum over ranks of g_ef, exactly.

Regions are balanced from the selections (Ok-Topk's "balanced split"): each rank's quantiles I[floor(j K / P)],
j = 1..P-1, summed exactly by one allreduce of P-1 integers, B_j = floor(sum / P). They are refreshed every
`rebalance_every` sparse steps (and at the first), are the same on every rank, and are checkpointed with the shared
state (so a resumed run continues bit for bit).

Bytes a rank sends: its phase-1 payloads to the P-1 other owners (at most its K pairs, about (P-1)/P of them when
the regions are balanced) and P-1 copies of its phase-2 payload (at most q pairs): at most 2K + 2 q (P-1) words for
any distribution of indices, within Ok-Topk's bound 6K(P-1)/P for every P >= 2; about 4K(P-1)/P when balanced,
against allgather's 2K(P-1).

SparseTransport is what top-k's two methods (topk.py, gravac.py) take from here: which transport runs (allgather
or this one, choose_transport) and the regions as their shared state.
"""
import math

from horovod_ext.compression.plan import k_of
from horovod_ext.compression.wire import allgather_wire_bytes, allreduce_wire_bytes
from . import clearly_fewer

TRANSPORTS = ("auto", "allgather", "sparse_reduce")
FRAME_OVERHEAD = 13  # a "delta" payload's fixed bytes: u32 length, CRC-32, value type, varint k, Rice parameter


def coded_pair_bits(numel, k, value_bits):
    """Bits one kept element costs in a "delta" payload: a Rice-coded gap (about log2(n / k) + 1.5 bits) and its
    value. An estimate (the coder picks its parameter from the gaps themselves), for planning only."""
    return math.log2(max(numel / max(k, 1), 1.0)) + 1.5 + value_bits


def planned_bytes(sizes, cf, nranks, value_bits=16):
    """{transport: estimated bytes a rank sends per step} for top-k at compression factor cf over tensors of
    `sizes` elements, delta-coded: allgather sends each payload to the N-1 others (ring); sparse_reduce (balanced
    regions) (N-1)/N of its pairs by alltoall, and N-1 copies of ceil(K/N) pairs by allgather (plus the periodic
    rebalance, negligible)."""
    ks = [k_of(n, cf) for n in sizes]
    total, kept = sum(sizes), sum(ks)
    per_tensor = sum(math.ceil(k * coded_pair_bits(n, k, value_bits) / 8) + FRAME_OVERHEAD for n, k in zip(sizes, ks))
    pair = coded_pair_bits(total, kept, value_bits) / 8
    quota = math.ceil(kept / nranks)
    alltoall = (nranks - 1) * (kept / nranks * pair + FRAME_OVERHEAD)
    owners = (nranks - 1) * (quota * pair + FRAME_OVERHEAD)
    return {"allgather": allgather_wire_bytes(per_tensor, nranks), "sparse_reduce": alltoall + owners,
            "sparse_reduce_alltoall": alltoall, "sparse_reduce_allgather": owners}


def choose_transport(requested, sizes, cf, nranks, value_bits=16):
    """"auto": sparse_reduce where it plans clearly fewer bytes per rank than allgather (transports.clearly_fewer:
    under 0.9x, so from 3 ranks on, since at 2 both send about K pairs; and at least 256 KB per rank per step fewer,
    20 ms at 100 Mbit/s, 2 ms at 1 Gbit/s, about what its second collective round after backward costs)."""
    if requested != "auto":
        return requested
    if nranks < 2 or not sizes:
        return "allgather"
    plan = planned_bytes(sizes, cf, nranks, value_bits)
    if clearly_fewer(plan["sparse_reduce"], plan["allgather"]):
        return "sparse_reduce"
    return "allgather"


class Regions:
    """The region bounds B_0 = 0 <= ... <= B_P = T, the same on every rank, and when they are next rebalanced.
    Held on the host (read and written by host calls, so that a TensorFlow graph sees each step's)."""

    def __init__(self, every):
        self.every = every
        self.bounds = None
        self.age = 0  # sparse steps since the last rebalance

    def due(self, total, nranks):
        """Whether this step rebalances: at the first, every `every` steps, and whenever the held bounds are not
        this job's (a checkpoint of another model or number of ranks)."""
        return int(self.bounds is None or self.age >= self.every or self.bounds[-1] != total
                   or len(self.bounds) != nranks + 1)

    def current(self):
        return tuple(self.bounds)

    @staticmethod
    def from_sums(sums, total):
        """B_j = floor(sum over ranks of their j-th quantile / P) (the sums are exact integers in float64)."""
        nranks = len(sums) + 1
        return tuple([0] + [int(s) // nranks for s in sums] + [int(total)])

    def store(self, due, *bounds):
        self.bounds = [int(b) for b in bounds]
        self.age = 1 if due else self.age + 1
        return tuple(self.bounds)

    def state(self):
        return None if self.bounds is None else {"bounds": list(self.bounds), "age": self.age}

    def load_state(self, state):
        """A checkpoint's regions (None: it was written before the first sparse step)."""
        self.bounds, self.age = (None, 0) if state is None else ([int(b) for b in state["bounds"]], int(state["age"]))


class SparseReduce:
    """The transport: reduce(be, items, indices, tag) -> (averages, payload bytes, wire bytes). items carry g_ef
    in item.work.flat (the residual's storage with error feedback); indices[t] are item t's selected positions
    (ascending int32). The kernels read the tensors in place as the segments of one index space (no
    concatenation), decode straight into the gradients' buffers (PyTorch), and touch only this rank's K entries of
    g_ef to leave each residual as the module docstring's step 4."""

    def __init__(self, owner, codec, every, ctx):
        self.owner = owner  # the method whose shared state holds the regions
        self.codec = codec  # top-k's, in error feedback where the compressor keeps residuals
        self.ctx, self.be = ctx, ctx.be  # the step context (context.py) and its backend
        self.regions = Regions(every)

    def reduce(self, be, items, indices, tag):
        k, nranks, rank = be.kernels, be.nranks, be.rank
        offsets = [0]
        for item in items:
            offsets.append(offsets[-1] + item.numel)
        kept = sum(be.size(idx) for idx in indices)
        with self.ctx.timed("compress_seconds"):
            positions = be.concat([idx + offset for idx, offset in zip(indices, offsets)])
        bounds, rebalance_bytes = self._bounds(be, positions, kept, offsets[-1], tag)  # may wait on an allreduce
        with self.ctx.timed("compress_seconds"):
            payload, region_bytes = k.topk_encode_regions([item.work.flat for item in items], positions, bounds,
                                                          self.codec.value_type)
        received = be.wait(be.alltoall(payload, region_bytes, be.step_name(f"topk.{tag}.sparse_reduce.alltoall")))
        with self.ctx.timed("compress_seconds"):
            # the owner sums what it received and keeps the ceil(K/P) largest sums (a corrupted payload gives a
            # marker payload instead, which fails phase 2 on every rank)
            reduced = k.topk_reduce_region(received, nranks, bounds[rank + 1] - bounds[rank],
                                           (kept + nranks - 1) // nranks, self.codec.value_type)
        gathered = be.wait(be.allgather(reduced, be.step_name(f"topk.{tag}.sparse_reduce.allgather")))
        with self.ctx.timed("decompress_seconds"):
            averages = k.topk_decode_regions(gathered, bounds, be.divisor, [item.numel for item in items],
                                             [be.output_buffer(item) for item in items])
            if self.codec.holds_residuals:
                residuals = k.topk_keep_applied([item.work.flat for item in items], averages, positions,
                                                self.codec.value_type)
                for item, residual in zip(items, residuals):
                    self.codec.keep(be, item, residual)
        sent, own, kept_sums = be.unstack(be.stack([be.size(payload), region_bytes[rank], be.size(reduced)],
                                                   "float64"), 3)
        payload_bytes = sent + kept_sums + rebalance_bytes[0]
        wire_bytes = sent - own + (nranks - 1) * kept_sums + rebalance_bytes[1]
        return averages, payload_bytes, wire_bytes

    def _bounds(self, be, positions, kept, total, tag):
        """This step's bounds (host values: a tuple of P+1 ints, or of scalar tensors in a graph) and the
        (payload, wire) bytes of the rebalance if one was due: every rank's selection quantiles, summed exactly
        by one allreduce of P-1 float64 integers."""
        nranks = be.nranks
        shape = ("int64",) * (nranks + 1)
        due, = be.host(self._due, [total, nranks], ("int32",))

        def current():
            return list(be.host(self.regions.current, [], shape)) + [be.stack([0, 0], "float64")]

        def rebalanced():
            picks = be.stack([positions[(j * kept) // nranks] for j in range(1, nranks)], "float64")
            sums = be.wait(be.allreduce(picks, be.step_name(f"topk.{tag}.sparse_reduce.rebalance"), "sum"))
            nbytes = 8 * (nranks - 1)
            return list(be.host(self.regions.from_sums, [sums, total], shape)) + \
                [be.stack([nbytes, allreduce_wire_bytes(nbytes, nranks)], "float64")]

        if nranks == 1:
            chosen = [0, total, be.stack([0, 0], "float64")]
        else:
            chosen = be.switch(due, [current, rebalanced])
        bounds = be.host(self._store, [due] + list(chosen[:-1]), shape)
        return bounds, be.unstack(chosen[-1], 2)

    def _due(self, total, nranks):
        self.be.shared_state_read(self.owner)  # TensorFlow: a checkpoint may have restored them
        return self.regions.due(total, nranks)

    def _store(self, due, *bounds):
        result = self.regions.store(due, *bounds)
        self.be.shared_state_written(self.owner)  # TensorFlow: into the variable a checkpoint holds
        return result


class SparseTransport:
    """What top-k's methods share about their transport: which one runs ("auto": choose_transport above,
    only with delta-coded fp16/fp32 values; recorded in the statistics), and sparse_reduce's regions as the
    method's shared state (resume.py)."""

    def choose(self, spec, sizes_, cf):
        requested = spec.transport
        if requested == "auto" and (spec.packing != "delta" or spec.value_dtype == "ternary"):
            requested = "allgather"
        value_bits = 32 if spec.value_dtype == "fp32" else 16
        self.transport = choose_transport(requested, sizes_, cf, self.ctx.nranks, value_bits)
        self.ctx.stats.extra["transport"] = self.transport
        self.sparse = SparseReduce(self, self.codec, spec.rebalance_every, self.ctx) \
            if self.transport == "sparse_reduce" else None

    def shared_state(self):
        return {"regions": self.sparse.regions.state()} if self.sparse is not None else None

    def load_shared_state(self, state):
        if self.sparse is not None and state is not None and "regions" in state:
            self.sparse.regions.load_state(state["regions"])
