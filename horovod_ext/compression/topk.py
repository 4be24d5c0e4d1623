"""Compression.topk and Compression.adaptive_topk, declared once: top-k with error feedback (Stich et al. 2018; Lin
et al. 2018) and GraVAC (Tyagi & Swany, IEEE CLOUD 2023) over it.

The specs (arguments and checks), the codec (select, extract and decode kernels; payload sizes from the C++ core) and
the methods: static top-k is the generic allgather method with error feedback; GraVAC's method adds the controller's
step (two selections, one allreduce of norms, the decision, then one of three paths). The math is in
cpp/include/hvdext/topk.h, its definition in python/hvdext_reference/topk.py, the controller in gravac.py.
"""
from . import sizes
from .gravac import GravacController, ewma_weight
from .plan import Allgather, Codec, DenseSplit, EncodeRecord, ErrorFeedback, Method, Record, count_dense, k_of, \
    require_decoded, send_dense
from .sparse_reduce import TRANSPORTS, SparseReduce, choose_transport
from .specs import CompressorSpec, check_bool, check_choice, check_int, check_real
from .wire import allreduce_wire_bytes

VALUE_DTYPES = ("fp16", "fp32", "ternary")
VALUE_DTYPE_IDS = {"fp16": 0, "fp32": 1, "ternary": 2}  # hvdext::ValueType
PACKINGS = ("auto", "delta", "int32")
POLICIES = ("exponential", "geometric")
TOPK_MAX_ELEMENTS = 2 ** 31  # int32 indices on the wire
NORM_BYTES = 32  # GraVAC's allreduce: |g_ef|^2, |C_min|^2, |C_c|^2 and the step time, float64


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


class AutoPacking:
    """What packing="auto" stands for in top-k and GraVAC: "delta" on the host; on a CUDA tensor "int32", whose
    select, extract and decode kernels run on the device, unless the settings need "delta" (value_dtype="ternary"
    or transport="sparse_reduce", coded on the host)."""

    def auto_packing(self, device):
        if device == "cpu" or self.value_dtype == "ternary" or self.transport == "sparse_reduce":
            return "delta"
        return "int32"


class SparseTransport:
    """What top-k's methods share about their transport: which one runs ("auto": sparse_reduce.choose_transport,
    only with delta-coded fp16/fp32 values; recorded in the statistics), and sparse_reduce's regions as the
    method's shared state (resume.py)."""

    def choose(self, spec, be, sizes_, cf, feedback):
        requested = spec.transport
        if requested == "auto" and (spec.packing != "delta" or spec.value_dtype == "ternary"):
            requested = "allgather"
        value_bits = 32 if spec.value_dtype == "fp32" else 16
        self.transport = choose_transport(requested, sizes_, cf, be.nranks, value_bits)
        be.stats.extra["transport"] = self.transport
        self.sparse = SparseReduce(self, self.codec, feedback, spec.rebalance_every, be) \
            if self.transport == "sparse_reduce" else None

    def shared_state(self):
        return {"regions": self.sparse.regions.state()} if self.sparse is not None else None

    def load_shared_state(self, state):
        if self.sparse is not None and state is not None and "regions" in state:
            self.sparse.regions.load_state(state["regions"])


class TopKRecord(EncodeRecord):
    """One tensor's step: g_ef as flat float32 (the residual's storage with error feedback), its k, and (by
    sparse_reduce) the selected positions."""

    __slots__ = ("k", "candidates")


class GravacRecord(Record):
    """One tensor's GraVAC step: g_ef, its selection at theta_min (sent) and its three squared norms."""

    __slots__ = ("flat", "candidates", "energy")


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

    def __init__(self, spec, be):
        super().__init__(spec, be)
        self.value_type = VALUE_DTYPE_IDS[spec.value_dtype]
        self.coded = spec.packing == "delta"
        self.cf = 1.0 / spec.ratio if hasattr(spec, "ratio") else None

    def k(self, numel):
        return k_of(numel, self.cf)

    def payload_bytes(self, numel):
        return None if self.coded else sizes.topk_payload_bytes(self.k(numel), self.value_type)

    def encode(self, be, item, flat, want_remainder=False):
        item.work.k = self.k(item.numel)
        return self.extract(be, flat if want_remainder else be.copy(flat), be.kernels.topk_select(flat, item.work.k))

    def extract(self, be, g_ef, idx):
        """(payload, remainder). The kernel writes the remainder into g_ef's storage where the framework can."""
        if self.coded:
            return be.kernels.topk_extract_coded(g_ef, idx, self.value_type)
        return be.kernels.topk_extract(g_ef, idx, self.value_type)

    def decode(self, be, item, gathered, into):
        return self.decode_k(be, item.numel, item.work.k, gathered, into)

    def decode_k(self, be, numel, k, gathered, into):
        """(average, -1 or a rank with bad indices); a corrupted "delta" payload raises on every rank."""
        if self.coded:
            return be.kernels.topk_decode_average_coded(gathered, be.nranks, numel, be.divisor, into)
        return be.kernels.topk_decode_average(gathered, k, be.nranks, numel, self.value_type, be.divisor, into)


class TopKMethod(SparseTransport, Allgather):
    """Static top-k with error feedback: by allgather (Allgather: each payload started in launch()), or by
    sparse_reduce (sparse_reduce.py): launch() selects each tensor's k as its gradient is ready, finish() runs the
    step's one alltoall and one allgather over all of them."""

    def __init__(self, spec, be, sizes_):
        super().__init__(spec, be, sizes_)
        self.choose(spec, be, self.sizes, 1.0 / spec.ratio, self.feedback)

    def launch(self, be, item):
        if self.sparse is None:
            return super().launch(be, item)
        item.kind = "payload"
        count_dense(be, item)
        with be.timed("compress_seconds"):
            flat = be.flat32(item.grad)
            item.work.flat = self.feedback.accumulate(be, item, flat)[0] if self.feedback is not None else be.copy(flat)
            item.work.k = self.codec.k(item.numel)
            item.work.candidates = be.kernels.topk_select(item.work.flat, item.work.k)
        be.count(compressed_elements=item.numel)
        return item

    def finish(self, be, items):
        if self.sparse is None:
            return super().finish(be, items)
        DenseSplit.finish(be, [i for i in items if i.kind == "small"])
        items = [i for i in items if i.kind == "payload"]
        if not items:
            return
        averages, payload_bytes, wire_bytes = self.sparse.reduce(be, items, [i.work.candidates for i in items], "static")
        be.count_runtime(payload_bytes=payload_bytes, wire_bytes=wire_bytes)
        for item, avg in zip(items, averages):
            be.write(item, avg)
            be.require(be.all_finite(avg), f"{item.name!r} {self.codec.nonfinite}")


class AdaptiveTopKMethod(SparseTransport, Method):
    """GraVAC's step, one decision behind its readings (gravac.py: the decision lag).
     1. launch(), per tensor as soon as its gradient is ready (in PyTorch's backward hook, overlapping the rest of
        backward): g_ef = g + r; top-k at theta_min and at the candidate theta_c from one selection (multi-level
        compression, topk_select_nested); the three squared norms; then the path the previous step's decision
        planned: theta_min's payload starts its allgather at once (r keeps the rest), or g_ef its allreduce
        (r = 0), as static top-k's payloads do. The plan (theta_min, theta_c, path) is read once, at the step's
        first launch.
    finish(), for all tensors at once:
     2. one allreduce(Average) of |g_ef|^2, |C_min(g_ef)|^2, |C_c(g_ef)|^2 (summed in parameter order) and this
        rank's time of the previous step, started before the payloads are waited for, so it rides beside them;
     3. the payloads decoded and written (sparse_reduce: the step's alltoall and allgather on the planned path);
     4. the controller takes in the averages and plans the next step (on the host: every rank has the same
        averages, so takes the same decision). Where the backend carries futures across steps (PyTorch), the
        averages are waited for at the next step's first launch, after its forward pass, so no step waits for
        them; reading the state or the statistics takes them in first. A TensorFlow graph waits in the step."""

    Record = GravacRecord

    def __init__(self, spec, be, sizes_):
        super().__init__(spec, be, sizes_)
        self.codec = TopKCodec(spec, be)
        self.feedback = ErrorFeedback(self.codec)
        self.controller = GravacController(spec, be.nranks)
        self.be, self.nranks = be, be.nranks
        self.step_plan = None  # (theta_min, theta_c, path index, cf) of the step being launched
        self.readings = None  # the last step's averaged readings in flight (backends that carry futures)
        self.step_sizes = list(self.sizes)  # the sizes of the tensors this step compresses
        self.choose(spec, be, self.sizes, spec.min_cf, self.feedback)

    def launch(self, be, item):
        item.kind = "payload"
        count_dense(be, item)
        theta_min, theta_c, path, _ = self._step(be)
        k = be.kernels
        with be.timed("compress_seconds"):
            item.work.flat, sumsq = self.feedback.accumulate(be, item, be.flat32(item.grad))
            k_min = be.k_of(item.numel, theta_min)
            first, second = k.topk_select_nested(item.work.flat, k_min, be.k_of(item.numel, theta_c, upper=k_min))
            item.work.candidates = first
            kept_min = k.sum_squares_at(item.work.flat, first)
            kept_c = kept_min if second is first else k.sum_squares_at(item.work.flat, second)
            item.work.energy = (sumsq, kept_min, kept_c)
        if self.sparse is None:  # sparse_reduce sends every tensor at finish(), in one alltoall
            item.future = be.switch(path, [lambda: self._gather(be, item), lambda: self._send_dense(be, item)])
        return item

    def _gather(self, be, item):
        """Start the allgather of the tensor's theta_min selection; r keeps the rest. Returns (gathered, dense,
        (payload, wire) bytes) in flight, dense being nothing (switch's branches return alike)."""
        with be.timed("compress_seconds"):
            payload, remainder = self.codec.extract(be, item.work.flat, item.work.candidates)
            self.feedback.keep(be, item, remainder)
        size = be.size(payload)
        return be.allgather(payload, be.name("topk.min", item)), be.nothing("float32"), \
            be.stack([size, size * (be.nranks - 1)], "float64")

    def _send_dense(self, be, item):
        """GraVAC's dense path: g_ef by allreduce, after which r = 0."""
        nbytes = 4 * item.numel
        return be.nothing("uint8"), send_dense(be, item, item.work.flat, self.feedback, "topk.dense"), \
            be.stack([nbytes, allreduce_wire_bytes(nbytes, be.nranks)], "float64")

    def abandon_step(self):
        self.step_plan = None

    def observations(self):
        self._take_readings()
        return self.controller.observations()

    def complete_in_flight(self):
        self._take_readings()

    def forget_in_flight(self):
        """An elastic reset: the last step's readings are dropped unread; the controller keeps what it had (at a
        commit, state_dict() took them in, so the committed controller is complete)."""
        self.readings = None
        self.abandon_step()

    def shared_state(self):
        self._take_readings()
        return {"controller": self.controller.state(), **(super().shared_state() or {})}

    def load_shared_state(self, state):
        self._take_readings()  # every rank started them: each waits, then the checkpoint replaces their effect
        if state is not None and state.get("controller") is not None:
            self.controller.load_state(state["controller"])
            self.controller.alpha = ewma_weight(self.nranks)  # a = N/100 for this job's N, not the saver's
        super().load_shared_state(state)

    def launch_dense(self, be, item):
        self.controller.forget_step_time()  # no decision this step: its time is no CF's
        return super().launch_dense(be, item)

    def _step(self, be):
        """(theta_min, theta_c, path index, cf) of this step, read from the controller at its first use."""
        if self.step_plan is None:
            self.step_plan = be.host(self._plan, [], ("float64", "float64", "int32", "float64"))
        return self.step_plan

    def _plan(self):
        self._take_readings()
        self.be.shared_state_read(self)  # TensorFlow: a checkpoint may have restored it
        return self.controller.plan()

    def _take_readings(self):
        """The previous step's averaged readings, left in flight by finish(), into the controller."""
        if self.readings is not None:
            readings, self.readings = self.readings, None
            self._agree(self.be, self.be.wait(readings), " at the previous step")

    def _decide(self, agreed):
        path, cf, gain_min, gain_c = self.controller.decide(*agreed)
        self.be.shared_state_written(self)
        self.be.count_decided(**self.decision_bytes(path, cf))
        theta_min, theta_c = self.controller.log[-1]["theta_min"], self.controller.log[-1]["candidate_cf"]
        self.be.stats.extra.update(cf=cf, path=path, gain_min=gain_min, gain_c=gain_c, theta_min=theta_min,
                                   candidate_cf=theta_c, settled=self.controller.settled,
                                   planned_cf=self.controller.planned[1])
        return 0

    def _step_ended(self):
        self.controller.step_ended()
        return 0

    def decision_bytes(self, path, cf):
        """The elements one step on `path` compresses (its bytes are counted as the path runs)."""
        return {} if path == "dense" else {"compressed_elements": sum(self.step_sizes)}

    def finish(self, be, items):
        _, _, path, _ = self._step(be)  # a step may launch nothing (every gradient sparse)
        self.step_plan, self.step_sizes = None, [item.numel for item in items]
        previous, = be.host(self.controller.previous_step_seconds, [], ("float64",))
        norms = be.stack([be.sum([item.work.energy[j] for item in items]) for j in range(3)] + [previous], "float64")
        agreement = be.allreduce(norms, be.step_name("adaptive_topk.norms"), "average")  # beside the payloads
        be.count(payload_bytes=NORM_BYTES, wire_bytes=allreduce_wire_bytes(NORM_BYTES, be.nranks))
        if self.sparse is not None:
            results = be.switch(path, [lambda: self._sparse(be, items), lambda: self._dense(be, items)])
            n = len(items)
            averages, flags = results[:n], results[n:2 * n]
            payload_bytes, wire_bytes = be.unstack(results[2 * n], 2)
            be.count_runtime(payload_bytes=payload_bytes, wire_bytes=wire_bytes)
        else:
            averages, flags = self._received(be, items, path)
        for item, avg, bad in zip(items, averages, flags):
            require_decoded(be, self.codec, item, bad)
            be.write(item, avg)
            be.require(be.all_finite(avg), f"{item.name!r} {self.codec.nonfinite}")
        be.host(self._step_ended, [], ("int32",))
        if be.carries_futures:
            self.readings = agreement
        else:
            self._agree(be, be.wait(agreement), "")  # a graph's tensors end with the step

    def _agree(self, be, agreed, when):
        """The controller takes in the rank-averaged readings and plans the next step, unless they are not finite
        (a NaN/Inf gradient: the step's error, raised on every rank)."""
        be.require(be.all_finite(agreed), f"every tensor (the squared norms of the gradients{when} are not finite on "
                                          f"some rank)")
        if be.failed():
            return
        be.host(self._decide, [be.guarded(agreed)], ("int32",))

    def _received(self, be, items, path):
        """Wait for each tensor's collective started in launch() and decode it: the averages and the bad-rank
        flags; its bytes are counted as sent."""
        averages, flags, sent = [], [], []
        for item in items:
            gathered_future, dense_future, nbytes = item.future
            gathered, dense = be.wait(gathered_future), be.wait(dense_future)
            sent.append(nbytes)
            with be.timed("decompress_seconds"):
                avg, bad = be.switch(path, [lambda: self._decode(be, item, gathered), lambda: [dense, be.no_flag()]])
            averages.append(avg)
            flags.append(bad)
        if sent:
            payload_bytes, wire_bytes = be.unstack(be.sum(sent), 2)
            be.count_runtime(payload_bytes=payload_bytes, wire_bytes=wire_bytes)
        return averages, flags

    def _decode(self, be, item, gathered):
        """[average, bad-rank flag] of the payloads gathered for the tensor's theta_min selection."""
        avg, bad = self.codec.decode_k(be, item.numel, be.size(item.work.candidates), gathered,
                                       be.output_buffer(item))
        return [avg, bad]

    def _sparse(self, be, items):
        """Send each tensor's theta_min selection by sparse_reduce; returns the averages, the bad-rank flags, and
        the (payload, wire) bytes sent."""
        averages, payload_bytes, wire_bytes = self.sparse.reduce(
            be, items, [item.work.candidates for item in items], "min")
        return averages + [be.no_flag() for _ in items] + [be.stack([payload_bytes, wire_bytes], "float64")]

    def _dense(self, be, items):
        """GraVAC's dense path: g_ef by allreduce, after which r = 0."""
        sent = [send_dense(be, item, item.work.flat, self.feedback, "topk.dense") for item in items]
        nbytes = 4 * sum(self.step_sizes)
        return [be.wait(f) for f in sent] + [be.no_flag() for _ in items] + \
            [be.stack([nbytes, allreduce_wire_bytes(nbytes, be.nranks)], "float64")]


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


class AdaptiveTopK(AutoPacking, CompressorSpec):
    """GraVAC (Tyagi & Swany, "GraVAC: Adaptive Compression for Communication-Efficient Distributed DL Training",
    IEEE CLOUD 2023), Algorithm 1: top-k with error feedback whose compression factor CF (dense size / sent size)
    moves during training, driven by the measured compression gain. See horovod_ext.compression.gravac for the
    controller, its math and its tuning guide.

    Args:
        min_cf, max_cf: the range of CF (>= 1, min_cf <= max_cf).
        epsilon: the smallest compression gain, sqrt(EWMA(|C(g_ef)|^2) / EWMA(|g_ef|^2)), a CF may have; in (0, 1].
        window: steps between CF moves (>= 1): at a window's end theta_min climbs to a candidate that kept epsilon
            over the window's second half, or steps down one rung if it no longer keeps epsilon itself.
        omega: relative tolerance: settle on the lower of the two CFs whose compression throughputs are highest
            when those are within omega; [0, 1).
        policy: the ladder of CFs the candidate climbs: "exponential" (min_cf x 2, 4, 16, 256, each scale the
            square of the last: CF 10, 20, 40, 160, 1000 from min_cf 10) or "geometric" (doubled each rung).
        value_dtype, packing, transport, rebalance_every: the payload's values and index coding and how the
            payloads travel, as Compression.topk's ("auto" plans its bytes at min_cf).

    Defaults. epsilon 0.7 is the lower of the two values the paper reports (0.7, 0.9; the authors' code: 0.75):
    with error feedback, top-k at CF 10 keeps a gain of 0.74-0.89 on the digits MLP and CNN and about 0.7 on a
    small LSTM, and every one of them trains at CF 10 as well as dense, so a higher epsilon sends dense what
    compresses without loss (at 0.9 every step of the digits MLP went dense; 0.85 kept no more accuracy than 0.7
    over three seeds). omega 0.05 is the authors' code's. window 100 steps lets the CF climb one rung per window,
    20, 40, 160 and 1000 after 100, 200, 300 and 400 steps at the earliest (the paper's 500 was chosen for runs of
    tens of thousands of steps: on runs of a few hundred the CF could not move); it is two EWMA time constants
    (1 / a = 100 / N steps) at 2 ranks and eight at 8, so a candidate is judged on readings that have mostly
    forgotten its predecessor's. The measurements behind
    them: benchmarks/RESULTS.md (GraVAC).
    """

    name = "adaptive_topk"
    payload = True
    method = AdaptiveTopKMethod
    max_elements = TOPK_MAX_ELEMENTS

    def __init__(self, min_cf=10, max_cf=1000, epsilon=0.7, window=100, omega=0.05, policy="exponential",
                 value_dtype="fp16", packing="auto", transport="auto", rebalance_every=32):
        min_cf = check_real("adaptive_topk min_cf", min_cf, low=1.0, low_open=False)
        max_cf = check_real("adaptive_topk max_cf", max_cf, low=1.0, low_open=False)
        if min_cf > max_cf:
            raise ValueError(f"adaptive_topk min_cf must be <= max_cf, got min_cf={min_cf!r} > max_cf={max_cf!r}")
        omega = check_real("adaptive_topk omega", omega, low=0.0, low_open=False)
        if omega >= 1.0:
            raise ValueError(f"adaptive_topk omega must be in [0, 1), got {omega!r}")
        super().__init__(min_cf=min_cf, max_cf=max_cf, epsilon=check_fraction("adaptive_topk epsilon", epsilon),
                         window=check_int("adaptive_topk window", window, low=1), omega=omega,
                         policy=check_choice("adaptive_topk policy", policy, POLICIES),
                         **check_values("adaptive_topk", value_dtype, packing, transport, rebalance_every))

    error_feedback = True
