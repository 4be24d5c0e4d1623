"""The plan of the two-phase ternary transport (framework-free): chunks, splits, byte counts, and the choice of
transport. The math is defined in python/hvdext_reference/two_phase.py; the kernels are in cpp/.

The step's compressed tensors, in parameter order, form one flat stream of T codes. Rank j owns the chunk
[bounds[j], bounds[j+1]), bounds[j] = floor(j*T/N). Phase 1 is one alltoall of packed code chunks, phase 2 one
allgather of each rank's chunk sums re-encoded at b = ceil(log2(2N+1)) bits.
"""
from horovod_ext.compression import sizes as sizes_
from horovod_ext.compression.sizes import PACKING_IDS
from horovod_ext.compression.wire import allgather_wire_bytes, allreduce_wire_bytes
from . import clearly_fewer


def packed_bytes(count, packing):
    return sizes_.ternary_packed_bytes(count, PACKING_IDS[packing])


def level_bits(nranks):
    return sizes_.two_phase_level_bits(nranks)


def stream_bytes(count, bits):
    return sizes_.two_phase_stream_bytes(count, bits)


class TwoPhasePlan:
    """Chunks of the flat code stream of tensors with `sizes` elements over `nranks` ranks."""

    def __init__(self, sizes, nranks, packing):
        self.sizes = [int(n) for n in sizes]
        self.nranks = nranks
        self.packing = packing
        self.total = sum(self.sizes)
        self.bounds = [(j * self.total) // nranks for j in range(nranks + 1)]
        self.counts = [self.bounds[j + 1] - self.bounds[j] for j in range(nranks)]
        self.bits = level_bits(nranks)
        self.offsets = [0]
        for n in self.sizes:
            self.offsets.append(self.offsets[-1] + n)
        self.send_splits = [packed_bytes(c, packing) for c in self.counts]
        self.stream_sizes = [stream_bytes(c, self.bits) for c in self.counts]

    def pieces(self, chunk):
        """(tensor index, first element in the chunk, count, first element in the tensor) covering chunk j."""
        lo, hi = self.bounds[chunk], self.bounds[chunk + 1]
        out = []
        for t, (start, end) in enumerate(zip(self.offsets, self.offsets[1:])):
            a, b = max(lo, start), min(hi, end)
            if a < b:
                out.append((t, a - lo, b - a, a - start))
        return out

    def wire_bytes(self, rank):
        """Bytes this rank sends: the alltoall chunks that leave it, and (N-1) times its re-encoded chunk."""
        alltoall = sum(s for j, s in enumerate(self.send_splits) if j != rank)
        return alltoall + (self.nranks - 1) * self.stream_sizes[rank]

    def payload_bytes(self, rank):
        return sum(self.send_splits) + self.stream_sizes[rank]


def allgather_transport_bytes(tensor_sizes, nranks, packing):
    """Bytes a rank sends when every tensor's payload (scale + packed codes) goes by ring allgather."""
    payload = sum(sizes_.ternary_payload_bytes(n, PACKING_IDS[packing]) for n in tensor_sizes)
    return allgather_wire_bytes(payload, nranks)


def choose_transport(requested, shared_scale, sizes, nranks, packing):
    """"auto": two_phase where it plans clearly fewer bytes per rank than allgather (transports.clearly_fewer: from
    4 ranks on for large models, where allgather's (N-1) payloads outgrow two-phase's log2(2N+1) bits an element),
    unless shared_scale is False (two-phase sums codes of one scale: it needs the shared scale)."""
    if requested != "auto":
        return requested
    if shared_scale is False or nranks < 2 or not sizes:
        return "allgather"
    two_phase = TwoPhasePlan(sizes, nranks, packing).wire_bytes(0)
    return "two_phase" if clearly_fewer(two_phase, allgather_transport_bytes(sizes, nranks, packing)) else "allgather"


def scale_sharing_bytes(ntensors, nranks):
    """The allreduce(Max) of every compressed tensor's float32 scale."""
    return allreduce_wire_bytes(4 * ntensors, nranks)
