"""Compression.ternary, declared once: TernGrad (Wen et al., NeurIPS 2017).

The spec (arguments and checks), the codec (kernels that encode and decode one tensor, payload sizes from the C++
core) and the method (its transports: allgather, or two-phase with a shared scale). The math is in
cpp/include/hvdext/ternary.h and two_phase.h; its definition in python/hvdext_reference/terngrad.py, two_phase.py.
"""
from horovod_ext.compression import sizes
from horovod_ext.compression.sizes import PACKING_IDS
from horovod_ext.compression.plan import (Allgather, Codec, DenseSplit, EncodeRecord, count_dense, decode_bucket_by,
                                          stream_of)
from horovod_ext.compression.specs import (CompressorSpec, SEED_LIMIT, check_bool, check_choice, check_int,
                                           check_real, check_resolved, shape_and_numel)
from horovod_ext.compression.wire import tensor_key
from .transports.two_phase import TwoPhasePlan, choose_transport, scale_sharing_bytes

PACKINGS = ("auto", "entropy", "base3", "2bit")
TRANSPORTS = ("auto", "allgather", "two_phase")
ENTROPY = PACKING_IDS["entropy"]
FIXED_OF = {"2bit": "2bit", "base3": "base3", "entropy": "base3"}  # the fixed packing inside two-phase's sums


class TernaryRecord(EncodeRecord):
    """One tensor's step: g (or g + r) as flat float32, and this rank's (or the shared) clip threshold and scale."""

    __slots__ = ("threshold", "scale")


class TernaryCodec(Codec):
    """One tensor: clip to clip * std(g), scale s = max|clipped g| (or the max over ranks), codes
    t_k = sign(g_k) with probability |g_k| / s (else 0), packed 4 or 5 per byte after the float32 s, or entropy
    coded (variable size: the non-zero codes' positions, Rice coded, and their signs; cpp/include/hvdext/coding.h).
    Decoding sums the N ranks' s_r * t_r and divides by the divisor, in one native pass: the same bits for every
    packing of the same codes."""

    Record = TernaryRecord
    bad_flag = "(on rank {})"  # decode reports the first rank whose scale is not finite (a NaN/Inf gradient)
    nonfinite = None  # the decode's flag already covers every NaN/Inf

    def __init__(self, spec, ctx):
        super().__init__(spec, ctx)
        self.clip = 0.0 if spec.clip is None else float(spec.clip)
        self.packing = PACKING_IDS[spec.packing]

    def payload_bytes(self, numel):
        """The spec's (Ternary.payload_bytes); None for "entropy", whose size is counted as the step runs."""
        return None if self.packing == ENTROPY else self.spec.payload_bytes(numel)

    def scale(self, be, item, flat):
        """This rank's (threshold, scale); scale = inf flags NaN/Inf."""
        item.work.threshold, item.work.scale = be.kernels.ternary_local_scale(flat, self.clip)

    def encode(self, be, item, flat):
        if item.work.scale is None:
            self.scale(be, item, flat)
        draws = (self.ctx.seed, self.ctx.step, tensor_key(item.name), be.rank)  # the counter-based draws' key
        if self.packing == ENTROPY:
            payload = be.kernels.ternary_encode_entropy(flat, item.work.threshold, item.work.scale, *draws)
        else:
            payload = be.kernels.ternary_encode(flat, item.work.threshold, item.work.scale, *draws, self.packing)
        return payload, None

    def codes(self, be, item, flat):
        """The unpacked codes (the same draws as encode), for the two-phase stream."""
        return be.kernels.ternary_encode_codes(flat, item.work.threshold, item.work.scale, self.ctx.seed,
                                               self.ctx.step, tensor_key(item.name), be.rank)

    def decode(self, be, item, gathered, into):
        if self.packing == ENTROPY:  # a corrupted payload raises (the same on every rank: they hold the same bytes)
            return be.kernels.ternary_decode_average_entropy(gathered, be.nranks, item.numel, be.divisor, into)
        return be.kernels.ternary_decode_average(gathered, be.nranks, item.numel, self.packing, be.divisor, into)

    def decode_bucket(self, be, items, result, header_bytes, outs):
        """One call for the bucket, any packing (Codec.decode_bucket)."""
        return decode_bucket_by(be, "ternary", self.packing, items, result, header_bytes, outs)

    def sent(self, be, item, payload):
        """s * t of this rank's own payload (exact: t is -1, 0 or 1), for error feedback."""
        if self.packing == ENTROPY:
            return be.kernels.ternary_decode_average_entropy(payload, 1, item.numel, 1.0)[0]
        return be.kernels.ternary_decode_average(payload, 1, item.numel, self.packing, 1.0)[0]


class TernaryMethod(Allgather):
    """Tensors below min_size go dense. Without a shared scale each payload is encoded and its allgather started
    in launch(). With one, finish() first takes one allreduce(Max) of every compressed tensor's scale (a NaN/Inf
    anywhere makes it +inf: that tensor fails on every rank), then encodes by allgather, or by two-phase: an
    alltoall of packed code chunks, exact integer sums re-encoded at ceil(log2(2N+1)) bits, an allgather of those
    (transports/two_phase.py has the chunk plan and its bytes)."""

    def __init__(self, spec, ctx, sizes_):
        super().__init__(spec, ctx, sizes_)
        compressed = [n for n in self.sizes if n >= spec.min_size]
        self.transport = choose_transport(spec.transport, spec.shared_scale, compressed, ctx.nranks,
                                          FIXED_OF[spec.packing])
        self.shared_scale = spec.shared_scale if spec.shared_scale is not None else self.transport == "two_phase"
        self.ctx.stats.extra["transport"] = self.transport
        self.ctx.stats.extra["shared_scale"] = self.shared_scale
        self.plan = None

    def launch(self, be, item):
        if not self.compressed(item):
            return DenseSplit.launch(be, self.ctx, item)
        if not self.shared_scale:
            return super().launch(be, item)
        item.kind = "payload"
        count_dense(self.ctx, item)
        with self.ctx.timed("compress_seconds"):
            item.work.flat = self.codec.prepare(be, item, be.flat32(item.grad))
            self.codec.scale(be, item, item.work.flat)
        return item

    def finish(self, be, items):
        compressed = [i for i in items if i.kind == "payload"]
        if self.shared_scale and compressed:
            self._share_scales(be, compressed)
            if self.ctx.failed():
                compressed = []
            elif self.transport == "two_phase":
                self._two_phase(be, compressed)
                compressed = []
            else:
                for item in compressed:
                    with self.ctx.timed("compress_seconds"):
                        payload, _ = self.codec.encode(be, item, item.work.flat)  # with error feedback: r = g_ef - s t
                        item.work.flat = None
                    self._gather(be, item, payload)
        DenseSplit.finish(be, self.ctx, [i for i in items if i.kind == "small"])
        self.decode_all(be, compressed)

    def _share_scales(self, be, items):
        """TernGrad's scaler sharing: every rank takes the max over ranks of each tensor's scale."""
        agreed = be.wait(be.allreduce(be.stack([item.work.scale for item in items], "float32"),
                                      be.step_name("ternary.shared_scales"), "max"))
        self.ctx.count(payload_bytes=4 * len(items), wire_bytes=scale_sharing_bytes(len(items), be.nranks))
        values = be.unstack(agreed, len(items))
        for item, value in zip(items, values):
            self.ctx.require(be.all_finite(value), f"{item.name!r} (on at least one rank)")
        for item, value in zip(items, values):
            item.work.scale = self.ctx.guarded(value)

    def _two_phase(self, be, items):
        sizes_ = [item.numel for item in items]
        fixed = FIXED_OF[self.spec.packing]
        if self.plan is None or self.plan.sizes != sizes_:
            self.plan = TwoPhasePlan(sizes_, be.nranks, fixed)
        plan, k, coded = self.plan, be.kernels, self.codec.packing == ENTROPY
        fixed_id = PACKING_IDS[fixed]
        with self.ctx.timed("compress_seconds"):
            codes = be.concat([self.codec.codes(be, item, item.work.flat) for item in items])
            for item in items:
                if self.codec.holds_residuals:  # r = g_ef - s t of the codes' own draws: what the chunk sums carry
                    self.codec.encode(be, item, item.work.flat)
                item.work.flat = None
            chunks = [codes[plan.bounds[j]:plan.bounds[j + 1]] for j in range(be.nranks)]
            if coded:  # each chunk entropy-coded (scale 1: the shared scales travel once, by allreduce)
                outgoing = [k.ternary_codes_encode_entropy(chunk) for chunk in chunks]
                splits = be.stack([be.size(part) for part in outgoing], "int32")
            else:
                outgoing = [k.ternary_pack(chunk, fixed_id) for chunk in chunks]
                splits = plan.send_splits
            send = be.concat(outgoing)
        received = be.wait(be.alltoall(send, splits, be.step_name("ternary.two_phase.alltoall")))
        with self.ctx.timed("compress_seconds"):
            count = plan.counts[be.rank]
            if coded:  # a corrupted chunk is flagged in this rank's stream: every rank then fails together
                received, bad = k.ternary_entropy_to_packed(received, be.nranks, count, fixed_id)
                fixed_stream = k.ternary_sum_reencode(received, be.nranks, count, fixed_id, plan.bits)
                stream = k.two_phase_levels_encode(fixed_stream, count, be.nranks, plan.bits, bad)
            else:
                stream = k.ternary_sum_reencode(received, be.nranks, count, fixed_id, plan.bits)
        gathered = be.wait(be.allgather(stream, be.step_name("ternary.two_phase.allgather")))
        with self.ctx.timed("decompress_seconds"), self.ctx.decoding(stream_of(items)):
            if coded:
                gathered = k.two_phase_levels_decode(gathered, plan.counts, plan.bits)
            parts = [[] for _ in items]
            position = 0
            for j, size in enumerate(plan.stream_sizes):
                chunk = gathered[position:position + size]
                position += size
                for t, first, count, _ in plan.pieces(j):
                    parts[t].append(k.two_phase_decode(chunk, items[t].work.scale, first, count, be.nranks, plan.bits,
                                                       be.divisor))
            for item, pieces in zip(items, parts):
                be.write(item, be.concat(pieces))
        self.ctx.count(compressed_elements=plan.total)
        if coded:
            sent = be.size(send)
            self.ctx.count_runtime(payload_bytes=sent + be.size(stream),
                                   wire_bytes=sent - be.size(outgoing[be.rank]) + (be.nranks - 1) * be.size(stream))
        else:
            self.ctx.count(payload_bytes=plan.payload_bytes(be.rank), wire_bytes=plan.wire_bytes(be.rank))


class Ternary(CompressorSpec):
    """TernGrad (Wen et al., NeurIPS 2017): stochastic, unbiased ternarization with a per-tensor scale.

    Each gradient g is clipped to +-clip*sigma(g), scaled by s = max|clipped g| (with ``shared_scale=True`` the max
    over ranks, one batched allreduce(Max) per step), and every element becomes s*sign(g_k) with probability
    |g_k|/s, else 0: unbiased, E[g~] = g. Codes travel entropy coded ("entropy", "auto"'s choice on the host: the
    positions of the non-zero codes as Rice-coded gaps and a sign bit each; its bits per element on real gradients:
    benchmarks/RESULTS.md, section "Wire codings"), or packed 5 per byte ("base3", 1.6 bits) or 4 per byte ("2bit"),
    plus the 4-byte scale, by allgather; every rank decodes and averages all payloads (the same bits for every
    packing). An entropy-coded payload carries a CRC-32: a corrupted one fails the step on every rank.

    Args:
        clip: clip gradients to clip * std(g) before ternarizing (paper: 2.5); None disables clipping.
        shared_scale: True: use the max of every rank's scale (TernGrad's "scaler sharing": one allreduce(Max) of
            the step's scales, after backward); False: each rank its own; None (the default): as the transport
            needs, shared under two_phase and not under allgather (compression_stats()["shared_scale"] says which).
        packing: "entropy" (variable size, about n H(codes) bits; coded on the CPU), "base3" (1.6 bits per element)
            or "2bit" (2 bits, simpler to decode), each encoded and decoded by the CUDA kernels on CUDA tensors;
            "auto" (the default): "entropy" for gradients on the host, "base3" for CUDA tensors, so that a GPU
            gradient never goes to the host and back (TensorFlow's ops run on the host: "entropy" there).
        min_size: tensors with fewer elements travel dense by allreduce (biases, norms); 0 compresses all.
        seed: key of the counter-based generator (with step, tensor, rank, element); None lets rank 0 draw one.
        transport: "allgather" (every rank receives every payload: bytes per rank grow with N), "two_phase" (a
            shared scale: an alltoall of code chunks, exact integer sums re-encoded at ceil(log2(2N+1)) bits, and an
            allgather of those: bytes per rank grow with log N; with "entropy" both the chunks and the sums are
            entropy coded), or "auto" (two_phase where it plans under 0.9x allgather's bytes per rank and at least
            256 KB a step fewer, unless shared_scale=False: transports.clearly_fewer; perfmodel projects the same
            choice). compression_stats()["transport"] says which ran.
        error_feedback: ternarize g + r and keep r = g + r - s * t for the next step (plan.ErrorFeedback; Seide et
            al. 2014, Karimireddy et al. 2019): what clipping and the random draws left out is sent later instead
            of lost. TernGrad itself has none (unbiased without it); residuals are in the optimizer's state.
    """

    name = "ternary"
    payload = True
    method = TernaryMethod
    codec = TernaryCodec
    packing_by_device = {"cpu": "entropy", "cuda": "base3"}

    def __init__(self, clip=2.5, shared_scale=None, packing="auto", min_size=1024, seed=None, transport="auto",
                 error_feedback=False):
        check_choice("ternary transport", transport, TRANSPORTS)
        if transport == "two_phase" and shared_scale is False:
            raise ValueError("ternary transport='two_phase' needs shared_scale=True (or None, the default: as the "
                             "transport needs): it sums the codes of all ranks as integers, which is exact only "
                             "when every rank uses the same scale")
        super().__init__(
            clip=check_real("ternary clip", clip, low=0.0, allow_none=True),
            shared_scale=check_bool("ternary shared_scale", shared_scale, allow_none=True),
            packing=check_choice("ternary packing", packing, PACKINGS),
            min_size=check_int("ternary min_size", min_size, low=0),
            seed=check_int("ternary seed", seed, low=0, high=SEED_LIMIT, allow_none=True),
            transport=transport,
            error_feedback=check_bool("ternary error_feedback", error_feedback),
        )

    @property
    def packing_id(self):
        return PACKING_IDS[self.packing]

    def payload_bytes(self, shape):
        """The float32 scale and the packed codes (sizes.ternary_payload_bytes: 4 + ceil(n / 4) bytes for "2bit",
        4 + ceil(n / 5) for "base3"); for "entropy" its largest size (a payload that would code larger is sent in
        base-3 mode: at most 14 bytes of framing, then ceil(n / 5)), the step counting the real one. Below
        min_size, the tensor's float32 allreduce (4 n)."""
        _, numel = shape_and_numel(shape)
        if numel < self.min_size:
            return 4 * numel
        return sizes.ternary_payload_bytes(numel, PACKING_IDS[check_resolved(self, self.packing)])
