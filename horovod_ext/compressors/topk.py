"""Compression.topk, declared once: top-k with error feedback (Stich et al. 2018; Lin et al. 2018).

The spec (arguments and checks, and what top-k and GraVAC (gravac.py) share about them), the codec (select, extract
and decode kernels; payload sizes from the C++ core) and the method: the generic allgather method with error
feedback, or sparse_reduce (transports/sparse_reduce.py, with the transport's choice). The math is in
cpp/include/hvdext/topk.h, its definition in python/hvdext_reference/topk.py.
"""
from horovod_ext.compression import sizes
from horovod_ext.compression.plan import (Allgather, Codec, DenseSplit, EncodeRecord, count_dense, decode_bucket_by,
                                          k_of)
from horovod_ext.compression.specs import (CompressorSpec, check_bool, check_choice, check_int, check_real,
                                           check_resolved, shape_and_numel)
from .transports.sparse_reduce import TRANSPORTS, SparseTransport

VALUE_DTYPES = ("fp16", "fp32", "ternary")
VALUE_DTYPE_IDS = {"fp16": 0, "fp32": 1, "ternary": 2}  # hvdext::ValueType
PACKINGS = ("auto", "delta", "int32")
TOPK_MAX_ELEMENTS = 2 ** 31  # int32 indices on the wire


def check_fraction(argument, value):
    value = check_real(argument, value, low=0.0)
    if value > 1.0:
        raise ValueError(f"{argument} must be in (0, 1], got {value!r}")
    return value


def check_values(name, value_dtype, packing, transport, rebalance_every):
    """The payload and transport settings of top-k and GraVAC, checked."""
    value_dtype = check_choice(f"{name} value_dtype", value_dtype, VALUE_DTYPES)
    packing = check_choice(f"{name} packing", packing, PACKINGS)
    transport = check_choice(f"{name} transport", transport, TRANSPORTS)
    if value_dtype == "ternary" and packing not in ("delta", "auto"):
        raise ValueError(f"{name} value_dtype='ternary' needs packing='delta' (its signs travel in the coded "
                         f"indices), got packing={packing!r}")
    if transport == "sparse_reduce" and (packing not in ("delta", "auto") or value_dtype == "ternary"):
        raise ValueError(f"{name} transport='sparse_reduce' needs packing='delta' and value_dtype 'fp16' or 'fp32' "
                         f"(its owners sum the values and send the sums), got packing={packing!r}, "
                         f"value_dtype={value_dtype!r}")
    return {"value_dtype": value_dtype, "packing": packing, "transport": transport,
            "rebalance_every": check_int(f"{name} rebalance_every", rebalance_every, low=1)}


def payload_bytes_at(spec, shape, cf):
    """Top-k's payload of a tensor of `shape` at compression factor cf (Compression.topk's and adaptive_topk's
    payload_bytes): with "int32" packing k = k_of(n, cf) int32 indices and k values (sizes.topk_payload_bytes:
    k (4 + 2) bytes with fp16 values, k (4 + 4) with fp32); None with "delta" (Rice-coded gaps, whose size
    depends on where the kept elements are: counted as the step runs; sparse_reduce.planned_bytes estimates it)."""
    _, numel = shape_and_numel(shape)
    if check_resolved(spec, spec.packing) == "delta":
        return None
    return sizes.topk_payload_bytes(k_of(numel, cf), VALUE_DTYPE_IDS[spec.value_dtype])


class AutoPacking:
    """What packing="auto" stands for in top-k and GraVAC: "delta" on the host; on a CUDA tensor "int32", whose
    select, extract and decode kernels run on the device, unless the settings need "delta" (value_dtype="ternary"
    or transport="sparse_reduce", coded on the host)."""

    def auto_packing(self, device):
        if device == "cpu" or self.value_dtype == "ternary" or self.transport == "sparse_reduce":
            return "delta"
        return "int32"


class TopKRecord(EncodeRecord):
    """One tensor's step: g_ef as flat float32 (the residual's storage with error feedback), its k, and (by
    sparse_reduce) the selected positions."""

    __slots__ = ("k", "candidates")


class TopKCodec(Codec):
    """The k elements of g_ef's largest |g_ef|: "delta" packing (variable size): the indices as Rice-coded gaps
    (about log2(n/k) + 1.5 bits each) and their values, fp16, fp32 or "ternary" (a sign bit each and one float32
    magnitude per tensor, the mean |value|: Sattler et al.'s sparse ternary compression); "int32" packing: k int32
    indices then k fp16/fp32 values. The remainder is g_ef - sent (exact for fp16/fp32: sent + remainder == g_ef;
    for ternary values, rounded once where |g_ef| and the magnitude are more than a factor two apart). Decoding
    scatter-adds the N payloads and divides by the divisor: the same bits for both packings of the same values."""

    Record = TopKRecord
    bad_flag = "(rank {} sent indices outside the tensor)"
    bad_flag_error = "payload"
    nonfinite = "(NaN/Inf on some rank, or beyond the fp16 range: try value_dtype='fp32')"

    def __init__(self, spec, ctx):
        super().__init__(spec, ctx)
        self.value_type = VALUE_DTYPE_IDS[spec.value_dtype]
        self.coded = spec.packing == "delta"
        self.cf = 1.0 / spec.ratio if hasattr(spec, "ratio") else None

    def k(self, numel):
        return k_of(numel, self.cf)

    def payload_bytes(self, numel):
        """The spec's (TopK.payload_bytes; None for "delta", whose size is counted as the step runs)."""
        return self.spec.payload_bytes(numel)

    def prepare(self, be, item, flat):
        """A copy of g: encode writes the remainder into what it is given."""
        return be.copy(flat)

    def encode(self, be, item, g, candidates=None):
        """(payload, g - sent, in g's storage where the framework can) of the k largest |g| (k: the ratio's), or of
        the given candidates (GraVAC's selection)."""
        if candidates is None:
            item.work.k = self.k(item.numel)
            candidates = be.kernels.topk_select(g, item.work.k)
        return self.extract(be, g, candidates)

    def extract(self, be, g_ef, idx):
        """(payload, remainder). The kernel writes the remainder into g_ef's storage where the framework can."""
        if self.coded:
            return be.kernels.topk_extract_coded(g_ef, idx, self.value_type)
        return be.kernels.topk_extract(g_ef, idx, self.value_type)

    def encodes_buckets(self, be):
        """Payloads are encoded a bucket at a time where the kernels can (Codec.encode_bucket)."""
        return hasattr(be.kernels, "topk_encode_bucket")

    def encode_bucket(self, be, items, flats, residuals=None):
        """The bucket's payloads in one call: each tensor's encode() of prepare(flat) (a copy; or, with error
        feedback's residuals, flat + r in r's storage), the same bits."""
        ks = []
        for item in items:
            item.work.k = self.k(item.numel)
            ks.append(item.work.k)
        if residuals is None:
            return be.kernels.topk_encode_bucket(None, [be.copy(flat) for flat in flats], ks, self.value_type,
                                                 self.coded)
        return be.kernels.topk_encode_bucket(flats, residuals, ks, self.value_type, self.coded)

    def decode(self, be, item, gathered, into):
        return self.decode_k(be, item.numel, item.work.k, gathered, into)

    def decode_bucket(self, be, items, result, header_bytes, outs):
        """"delta" payloads: one call for the bucket (Codec.decode_bucket)."""
        return decode_bucket_by(be, "topk_coded", 0, items, result, header_bytes, outs) if self.coded else None

    def sent(self, be, item, payload):
        """The values one payload stands for (one rank's, undivided): a payload another rank broadcast."""
        if self.coded:
            return be.kernels.topk_decode_average_coded(payload, 1, item.numel, 1.0)[0]
        return be.kernels.topk_decode_average(payload, self.k(item.numel), 1, item.numel, self.value_type, 1.0)[0]

    def decode_k(self, be, numel, k, gathered, into):
        """(average, -1 or a rank with bad indices); a corrupted "delta" payload raises on every rank."""
        if self.coded:
            return be.kernels.topk_decode_average_coded(gathered, be.nranks, numel, be.divisor, into)
        return be.kernels.topk_decode_average(gathered, k, be.nranks, numel, self.value_type, be.divisor, into)


class TopKMethod(SparseTransport, Allgather):
    """Static top-k with error feedback: by allgather (Allgather: each payload started in launch()), or by
    sparse_reduce (transports/sparse_reduce.py): launch() selects each tensor's k as its gradient is ready, finish()
    runs the step's one alltoall and one allgather over all of them."""

    def __init__(self, spec, ctx, sizes_):
        super().__init__(spec, ctx, sizes_)
        self.choose(spec, self.sizes, 1.0 / spec.ratio)

    def launch(self, be, item):
        if self.sparse is None:
            return super().launch(be, item)
        item.kind = "payload"
        count_dense(self.ctx, item)
        with self.ctx.timed("compress_seconds"):
            item.work.flat = self.codec.prepare(be, item, be.flat32(item.grad))
            item.work.k = self.codec.k(item.numel)
            item.work.candidates = be.kernels.topk_select(item.work.flat, item.work.k)
        self.ctx.count(compressed_elements=item.numel)
        return item

    def finish(self, be, items):
        if self.sparse is None:
            return super().finish(be, items)
        DenseSplit.finish(be, self.ctx, [i for i in items if i.kind == "small"])
        items = [i for i in items if i.kind == "payload"]
        if not items:
            return
        averages, payload_bytes, wire_bytes = self.sparse.reduce(be, items, [i.work.candidates for i in items],
                                                                 "static")
        self.ctx.count_runtime(payload_bytes=payload_bytes, wire_bytes=wire_bytes)
        for item, avg in zip(items, averages):
            be.write(item, avg)
            self.ctx.require(be.all_finite(avg), f"{item.name!r} {self.codec.nonfinite}")


class TopK(AutoPacking, CompressorSpec):
    """Layer-wise top-k by magnitude with error feedback (Stich et al. 2018; Lin et al. 2018).

    Each tensor keeps the k = max(1, ceil(ratio * n)) elements of largest |g + r| and carries the rest in its
    residual r to the next step: g_ef = g + r; sent = top_k(g_ef); r = g_ef - sent (nothing is lost, only delayed).
    The payload travels by allgather and is decoded with one scatter-add of all ranks' payloads. Residuals are in
    the optimizer's state_dict().

    Args:
        ratio: fraction of each tensor's elements sent, in (0, 1] (0.01: compression factor 100 / 1.5 for fp16).
        error_feedback: keep the residual (recommended; without it top-k is biased).
        value_dtype: "fp16", "fp32", or "ternary" (a sign bit per kept element and one magnitude per tensor, the
            mean |value|, Sattler et al. 2019; what that leaves out stays in the residual; needs packing="delta").
        packing: "delta" (indices as Rice-coded gaps, about log2(1/ratio) + 1.5 bits each: at ratio 0.01 about 0.25
            bits per element with fp16 values, 0.1 with ternary ones; coded on the CPU), "int32" (32 bits each;
            selected, extracted and decoded by the CUDA kernels on CUDA tensors), or "auto" (the default: "delta"
            for gradients on the host, "int32" for CUDA tensors unless value_dtype="ternary" or
            transport="sparse_reduce" need "delta"; AutoPacking).
        transport: "allgather" (every rank receives every rank's payload: each rank sends (N-1) payloads, linear in
            N), "sparse_reduce" (Ok-Topk's sparse allreduce, sparse_reduce.py: one alltoall to the owners of N
            index regions, which sum the entries exactly and keep the ceil(K/N) largest sums, then one allgather of
            those: about 4K(N-1)/N words per rank, at most 6K(N-1)/N, whatever N; what the global selection drops
            goes back into the sender's residual; needs packing="delta" and fp16/fp32 values), or "auto"
            (sparse_reduce where it plans at most 0.9x allgather's bytes per rank and saves at least 256 KB per
            step: sparse_reduce.choose_transport).
        rebalance_every: sparse_reduce's regions are rebalanced from the selections (one allreduce of N-1 integers)
            every this many steps, and at the first.
    """

    name = "topk"
    payload = True
    method = TopKMethod
    codec = TopKCodec
    max_elements = TOPK_MAX_ELEMENTS

    def __init__(self, ratio=0.01, error_feedback=True, value_dtype="fp16", packing="auto", transport="auto",
                 rebalance_every=32):
        super().__init__(ratio=check_fraction("topk ratio", ratio),
                         error_feedback=check_bool("topk error_feedback", error_feedback),
                         **check_values("topk", value_dtype, packing, transport, rebalance_every))

    def payload_bytes(self, shape):
        """payload_bytes_at compression factor 1 / ratio: k = k_of(n, 1 / ratio), about ratio n, at least 1."""
        return payload_bytes_at(self, shape, 1.0 / self.ratio)
