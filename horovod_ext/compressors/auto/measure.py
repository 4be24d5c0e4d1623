"""What Compression.auto measures, framework-free, eagerly (PyTorch; TensorFlow eagerly or inside a host call of a
traced step): the link's probe, each candidate's round trip on a gradient, and the window's measurements.

- The probe (``probe_link``): an allreduce and an allgather of float32 slices of the largest gradient, 4 KB upwards,
  x4 a size, 3 times each; after each size every rank takes the slowest rank's times (one allreduce(Max)), so every
  rank stops at the same size: at the largest gradient, or before a size whose predicted seconds
  (``next_size_seconds``) would take the probe's total on the slowest rank past probe_seconds.
  choice.Link.fit turns the samples into latency and seconds per byte per collective kind.
- A round trip (``round_trip``): candidate c on x = g + r: its payload, the N payloads' decode (the rank's own payload
  N times: the kernels' work at N ranks), what it sends of x, and the gain <x, C(x)> / (|x| |C(x)|) (choice);
  its seconds are the kernels' (the inner products wait for the device).
"""
import math
import statistics
import time

from horovod_ext.compression.plan import Item
from ..powersgd import PowerSGD
from .choice import Link

LINEAR = ("none", "fp16")  # Horovod's compressors, by allreduce
FIELDS = 4  # per (tensor, candidate): sums of gains, samples, kernel seconds and payload bytes
MIN_INTERVALS = 5  # a window measures its choice's step from this many step intervals up
WARM_ITERATIONS = 2  # untimed power iterations that warm PowerSGD's Q before its measured step (powersgd_round_trip)


def floats(be, tensor, n):
    """A 1-D tensor's n values as Python floats (eagerly)."""
    return [float(v) for v in be.unstack(tensor, n)]


def sent_dense(candidate, n):
    """Whether a payload candidate's own method sends a tensor of n elements dense by allreduce (below its own
    min_size: ternary's biases and norms), as the static compressor does."""
    return not isinstance(candidate, str) and n < (getattr(candidate, "min_size", None) or 0)


def candidate_name(candidate):
    return candidate if isinstance(candidate, str) else candidate.describe()


def short_name(candidate):
    """A candidate as compression_stats() and the log name it: "topk(ratio=0.01)", "ternary", "powersgd(rank=4)"."""
    if isinstance(candidate, str):
        return candidate
    key = {"topk": "ratio", "powersgd": "rank"}.get(candidate.name)
    return f"{candidate.name}({key}={candidate.settings[key]!r})" if key else candidate.name


def probe_link(be, flat, probe_seconds, tag):
    """choice.Link of this job's allreduce and allgather (see the module docstring); flat: a float32 gradient."""
    limit = int(be.size(flat))
    samples = {kind: [] for kind in ("allreduce", "allgather")}
    n, index, spent, last = 1024, 0, 0.0, None
    while True:
        n = min(n, limit)
        part = be.split(flat, [n, limit - n])[0] if n < limit else flat
        times = []
        for kind in ("allreduce", "allgather"):
            for rep in range(3):
                name = be.step_name(f"auto.probe.{tag}.{kind}.{index}.{rep}")
                start = time.perf_counter()
                be.wait(be.allreduce(part, name, "sum") if kind == "allreduce" else be.allgather(part, name))
                times.append(time.perf_counter() - start)
        slowest = floats(be, be.wait(be.allreduce(be.stack(times, "float64"),
                                                  be.step_name(f"auto.probe.{tag}.times.{index}"), "max")), 6)
        samples["allreduce"] += [(4.0 * n, s) for s in slowest[:3]]
        samples["allgather"] += [(4.0 * n, s) for s in slowest[3:]]
        index += 1
        size_seconds = sum(slowest)
        spent += size_seconds
        grown = min(4 * n, limit)
        if n >= limit or spent + next_size_seconds(size_seconds, last, grown / n) > probe_seconds:
            return Link.fit(samples)
        n, last = grown, size_seconds


def next_size_seconds(seconds, last, ratio):
    """The next size's predicted seconds, `ratio` times the bytes of the size that took `seconds` (the one before it
    took `last`, at a quarter of its bytes): `ratio` times as long, or where the time grew faster than the bytes (a
    shaper's burst carries the first sizes at line rate) as fast as it grew (per x4 of the bytes)."""
    growth = seconds / last if last and seconds > 4 * last else 4.0
    return seconds * growth ** (math.log(ratio) / math.log(4.0))


def round_trip(be, ctx, item, x, candidate, shape):
    """(gain, kernel seconds, payload bytes per rank) of `candidate` on x (flat float32) of the tensor `item`."""
    start = time.perf_counter()
    if candidate == "none" or sent_dense(candidate, item.numel):
        return 1.0, 0.0, 4.0 * item.numel
    if candidate == "fp16":
        sent, nbytes = be.cast(be.cast(x, "float16"), "float32"), 2.0 * item.numel
    elif isinstance(candidate, PowerSGD):
        sent, nbytes, warming = powersgd_round_trip(be, item, x, candidate, shape)
        start += warming
    else:
        codec = candidate.codec(candidate, ctx)
        probe = Item(item.index, item.name, item.grad, item.numel, item.itemsize)
        probe.work = codec.Record()
        payload, _ = codec.encode(be, probe, be.copy(x))
        sent = codec.sent(be, probe, payload)
        codec.decode(be, probe, be.concat([payload] * be.nranks), None)
        nbytes = float(be.size(payload))
    dot, xx, ss = floats(be, be.inner_products(x, sent), 3)  # waits for the device
    seconds = time.perf_counter() - start
    gain = dot / math.sqrt(xx * ss) if xx > 0 and ss > 0 else (1.0 if xx == ss else 0.0)
    return gain, seconds, nbytes


def powersgd_round_trip(be, item, x, candidate, shape):
    """P Q^T of PowerSGD's step on M (x as n x m) from a warm Q, its factors' bytes, and the seconds spent warming Q
    (not the step's: in force, each step runs one power iteration from the last step's Q, Vogels et al. 2019). Q is
    warmed by WARM_ITERATIONS untimed iterations from x's first cols * r elements: a cold Q's one iteration understates
    what a warm Q sends (benchmarks/RESULTS.md, section "Compression.auto, the step grid at 2 ranks at epsilon 0.4").
    x itself where the tensor goes dense (PowerSGD.layout)."""
    layout = candidate.layout(shape)
    if layout is None:
        return x, 4.0 * item.numel, 0.0
    rows, cols, r = layout
    m = be.reshape(x, (1, rows, cols))

    def power_iteration(q):  # P = orth(M orth(Q)), Q' = M^T P
        p = be.orthogonalize(be.matmul(m, be.orthogonalize(q, candidate.orthogonalization)),
                             candidate.orthogonalization)
        return p, be.matmul(m, p, transpose_a=True)

    warming = time.perf_counter()
    q = be.reshape(be.split(x, [cols * r, item.numel - cols * r])[0] if item.numel > cols * r else x, (1, cols, r))
    for _ in range(WARM_ITERATIONS):
        q = power_iteration(q)[1]
    flat_q = be.reshape(q, (-1,))
    floats(be, be.inner_products(flat_q, flat_q), 3)  # waits for the device: the warming is not the step's
    warming = time.perf_counter() - warming
    p, q = power_iteration(q)
    approx = be.reshape(be.matmul(p, q, transpose_b=True), (-1,))
    return approx, float(candidate.payload_bytes(shape)), warming


class Measures:
    """A window's measurements, per (tensor, candidate): the samples, and the sums of their gains, kernel seconds and
    payload bytes (sums, so that the ranks' average gives the pooled mean whatever each rank measured); the steps'
    compute and overlap seconds; and the seconds between consecutive steps' ends (the measured step of the choice in
    force, by its median: an evaluation or a checkpoint between two steps does not move it)."""

    def __init__(self, ntensors, ncandidates):
        self.values = [[[0.0, 0.0, 0.0, 0.0] for _ in range(ncandidates)] for _ in range(ntensors)]
        self.compute, self.overlap, self.steps = 0.0, 0.0, 0
        self.intervals = []

    def add(self, t, c, gain, seconds, nbytes):
        v = self.values[t][c]
        v[0] += gain
        v[1] += 1
        v[2] += seconds
        v[3] += nbytes

    def step(self, compute, overlap):
        self.compute += compute
        self.overlap += overlap
        self.steps += 1

    def interval(self, seconds):
        """The seconds from the last step's end to this one's."""
        self.intervals.append(seconds)

    def vector(self):
        """What the ranks average: every (tensor, candidate)'s four fields, then mean compute, mean overlap, whether
        any step was timed, the median step interval, and whether one was measured (MIN_INTERVALS at least)."""
        flat = [x for row in self.values for v in row for x in v]
        steps = max(self.steps, 1)
        timed = len(self.intervals) >= MIN_INTERVALS
        return flat + [self.compute / steps, self.overlap / steps, float(self.steps > 0),
                       statistics.median(self.intervals) if timed else 0.0, float(timed)]
