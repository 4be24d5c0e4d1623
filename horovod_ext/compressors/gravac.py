"""GraVAC's controller (Tyagi & Swany, IEEE CLOUD 2023, Algorithm 1), framework-free, over scalars.

GraVAC picks the compression factor (CF = dense size / sent size) of top-k with error feedback from two measured
quantities, both averaged over ranks so that every rank takes the same decision:

- the compression gain of a CF theta, the share of the error-compensated gradient g_ef = g + r that top-k at theta
  keeps, as a ratio of norms smoothed over steps:

      gain(theta) = sqrt( EWMA(|C_theta(g_ef)|^2) / EWMA(|g_ef|^2) )      (sums over all compressed tensors)

  EWMA(x)_t = (1 - a) EWMA_{t-1} + a x_t with a = N / 100 for N ranks (the paper's smoothing factor: more ranks
  average more samples per step, so each step's reading is less noisy and may weigh more), capped at 1;
- the compression throughput of a CF, gain x steps per second (samples per second at a fixed batch size), where a
  step's time t_iter is the wall time from one decision to the next: compute, compression and communication, as
  the paper's t_iter. That time is only known at the next decision, so it is filed under the CF the previous step
  actually sent (theta_min, or 1 for dense): throughput(cf) = mean over the steps that sent cf of
  gain_sent / t_iter.

The CFs explored form a ladder: min_cf, then min_cf x theta_s for theta_s = 2, 4, 16, 256 ("exponential" policy:
squared each rung) or 2, 4, 8, ... ("geometric": doubled), capped at max_cf (from min_cf 10: 10, 20, 40, 160, 1000).
theta_min is the rung sent, theta_c the rung above it while exploring (theta_min itself once settled). Each step:
 1. every tensor is compressed at theta_min, and that result again at theta_c (top-k of a top-k equals top-k at
    theta_c: the paper's multi-level compression), which is measured beside it; the step sends theta_min's
    payload, or the dense g_ef (and resets the residual) if the previous step's decision said so;
 2. the step's three squared norms and the previous step's time are averaged over ranks (one small allreduce that
    rides beside the payloads), and the next step's path is decided from them: theta_min if gain(theta_min) >=
    epsilon or theta_min is above min_cf (a rung that kept epsilon over a window is held until its window ends),
    else dense;
 3. at the end of each window: while exploring, if the two highest throughputs in the table are within omega
    (relative), the CF has saturated: settle on the lower of the two CFs (theta_ideal; more gain for the same
    speed) and stop exploring; else, if the candidate's gain kept epsilon on each of the window's last window / 2
    steps, theta_min climbs to it (the next rung becomes the candidate), and a candidate that did not is measured
    again in the next window (the gains rise as training goes on). Settled or not, a theta_min above min_cf whose
    gain is below epsilon steps down one rung.
 So the CF sent moves only at a window's end, one rung at a time, and dense steps happen only at min_cf.

The decision lag. The paper decides per window from smoothed readings, so the decision need not stop the step that
measures it: step t sends what the readings agreed at the end of step t-1 chose, its payloads leave as soon as each
gradient is ready (PyTorch's backward hooks, as static top-k's), and its readings travel beside them. Every rank
takes the same decisions because each is a function of the controller's state and the rank-averaged readings, in
the same order on every rank; the next step's decision is part of the state (checkpointed).

Choices where the paper and the authors' code differ, and why:
- The gain's denominator is |g_ef| (the gradient plus residual), not the authors' code's |g|. Under error feedback
  the residual grows until what top-k sends carries the incoming mass, so |C(g_ef)| / |g| rises with the CF, far
  above any epsilon, and would drive every model to max_cf. |C(g_ef)| / |g_ef| stays in [0, 1] and falls with the
  CF whatever was sent before (benchmarks/RESULTS.md, GraVAC: the gains measured at each CF).
- The gain is a ratio of norms (as in the authors' code) rather than of squared norms, so that epsilon reads on the
  paper's scale (it reports 0.7 and 0.9; the authors' code defaults to 0.75).
- The CF sent is the rung, moved at a window's end, where the paper sends the candidate on any step whose gain
  keeps epsilon, raises theta_min when the two gains are within omega, and otherwise moves the candidate on by the
  policy whatever it read. Under error feedback the gain falls with the CF (below), so the two gains are never
  within omega, and two things go wrong: the candidate runs past the CFs that keep epsilon to ones that do not,
  after which every step falls back to min_cf; and a candidate whose gain sits at epsilon is sent on some steps and
  not others, a flip-flop that costs accuracy static top-k at either CF does not lose (benchmarks/RESULTS.md,
  GraVAC: the paper's rule on the nplm and the digits MLP). A candidate that failed is measured again rather than
  skipped, because a CF that fails early may keep epsilon later, which is the paper's premise; the climb asks for
  a candidate that kept epsilon on every step of the window's second half, and a climbed rung is held through
  dips below epsilon until its window ends.
- The EWMAs are kept per CF: a CF's EWMA restarts when a new CF takes its role (the old CF's readings say nothing
  about the new one), and the candidate's carries over when theta_min rises to it (the same CF's readings).
- A step's time t_iter is measured from the end of the previous step's communication to the end of its own (rank
  local), so it is known after the step; it is averaged over ranks with the next step's norms and filed under the
  CF that step sent. Steps whose time is unknown (the first, the first after a restore, those around a step every
  rank sent dense because a rank joined) record no throughput.

Tuning guide: epsilon is the gain a CF must keep (lower it to compress harder); window is how many steps each
candidate is tried (the EWMA needs about 100 / N steps to forget; the exponential policy reaches max_cf 1000 from
min_cf 10 after four windows at the earliest); omega is the tolerance of the settling rule.
The state (the rung, theta_ideal, EWMAs, the throughput table, running totals) is a plain dict whose size
does not grow with the steps taken. The per-step log keeps the last `window` decisions in memory (what
compression_stats() shows; a run that plots CF over training reads it after each step) and is not checkpointed:
no decision reads it.
"""
import collections
import math
import time

from horovod_ext.in_flight import hold, release

from horovod_ext.compression.feedback import ErrorFeedback
from horovod_ext.compression.plan import Method, Record, count_dense, require_decoded, send_dense
from horovod_ext.compression.specs import CompressorSpec, check_choice, check_int, check_real
from horovod_ext.compression.wire import allreduce_wire_bytes
from .topk import TOPK_MAX_ELEMENTS, AutoPacking, TopKCodec, check_fraction, check_values, payload_bytes_at
from .transports.sparse_reduce import SparseTransport

POLICIES = ("exponential", "geometric")
NORM_BYTES = 32  # GraVAC's allreduce: |g_ef|^2, |C_min|^2, |C_c|^2 and the step time, float64

PATHS = ("min", "dense")


def ladder(spec):
    """The CFs the exploration climbs: min_cf, then min_cf x theta_s for theta_s = 2, 4, 16, 256, ... (policy
    "exponential": squared) or 2, 4, 8, ... ("geometric": doubled), the last one max_cf."""
    rungs, scale = [float(spec.min_cf)], 2.0
    while rungs[-1] < spec.max_cf:
        rungs.append(min(spec.min_cf * scale, float(spec.max_cf)))
        scale = scale * scale if spec.policy == "exponential" else scale * 2
    return rungs


def ewma_weight(nranks):
    """The paper's smoothing factor a = N / 100 for N ranks, capped at 1."""
    return min(1.0, max(1, int(nranks)) / 100.0)


def new_totals():
    """Running totals of the decisions: steps per path and steps per CF sent."""
    return {"paths": {path: 0 for path in PATHS}, "cf_steps": {}}


class GravacController:
    """Algorithm 1 over rank-averaged scalars, one step behind the readings; see the module docstring."""

    def __init__(self, spec, nranks=1):
        self.spec = spec
        self.alpha = ewma_weight(nranks)
        self.ladder = ladder(spec)
        self.rung = 0  # theta_min = ladder[rung]
        self.kept_steps = 0  # consecutive steps whose candidate gain kept epsilon
        self.theta_ideal = None  # set once the throughput saturates (settled)
        self.ewma_ef = None  # EWMA(|g_ef|^2)
        self.ewma_kept = {}  # cf -> EWMA(|C_cf(g_ef)|^2), for theta_min and theta_c
        self.throughput = {}  # cf sent -> [sum of gain / t_iter, steps]
        self.planned = ("min", self.theta_min)  # (path, cf) the next step sends
        self.previous = None  # (cf, gain) the last measured step sent, until its step time is known
        self.ended_at = None  # this rank's clock at the end of the last step (not state: a restore starts it again)
        self.last_seconds = 0.0  # this rank's time of the last step (0: unknown)
        self.step = 0
        # the last `window` steps: step, cf sent, path, gain_min, gain_c, theta_min, candidate, t_iter
        self.log = collections.deque(maxlen=spec.window)
        self.totals = new_totals()

    @property
    def settled(self):
        return self.theta_ideal is not None

    @property
    def theta_min(self):
        return self.ladder[self.rung]

    # ------------------------------------------------------------------------------------------------ the CFs
    def candidate_cf(self):
        return self.theta_min if self.settled else self.ladder[min(self.rung + 1, len(self.ladder) - 1)]

    def cfs(self):
        """(theta_min, theta_c) the adapter compresses at this step."""
        return self.theta_min, self.candidate_cf()

    def plan(self):
        """(theta_min, theta_c, path index in PATHS, cf) of the step about to be launched."""
        path, cf = self.planned
        return (*self.cfs(), PATHS.index(path), cf)

    def gain(self, cf):
        """sqrt(EWMA(|C_cf(g_ef)|^2) / EWMA(|g_ef|^2)), or None for a CF not measured yet."""
        kept = self.ewma_kept.get(cf)
        if kept is None or self.ewma_ef is None:
            return None
        return math.sqrt(kept / self.ewma_ef) if self.ewma_ef > 0 else 1.0

    # -------------------------------------------------------------------------------------------- a decision
    def _smooth(self, old, value):
        return value if old is None else (1 - self.alpha) * old + self.alpha * value

    def decide(self, norm_ef, norm_min, norm_c, previous_seconds):
        """Take in the step just taken: the rank-averaged squared norms |g_ef|^2, |C_min(g_ef)|^2, |C_c(g_ef)|^2
        at that step's cfs() and the rank-averaged time of the step before it (<= 0: unknown); plan the next
        step. Returns (path, cf sent, gain_min, gain_c) of the step just taken, its gains as smoothed with its
        readings."""
        values = (norm_ef, norm_min, norm_c, previous_seconds)
        if not all(math.isfinite(v) for v in values):
            raise FloatingPointError("NaN or Inf in the gradients (their squared norms are not finite)")
        if self.previous is not None and previous_seconds > 0:
            cf, gain = self.previous
            entry = self.throughput.setdefault(cf, [0.0, 0])
            entry[0] += gain / previous_seconds
            entry[1] += 1
        theta_min, theta_c = self.cfs()
        path, cf = self.planned
        self.ewma_ef = self._smooth(self.ewma_ef, norm_ef)
        kept = {theta_min: self._smooth(self.ewma_kept.get(theta_min), norm_min)}
        if theta_c != theta_min:
            kept[theta_c] = self._smooth(self.ewma_kept.get(theta_c), norm_c)
        self.ewma_kept = kept
        gain_min, gain_c = self.gain(theta_min), self.gain(theta_c)
        kept_eps = theta_c != theta_min and gain_c is not None and gain_c >= self.spec.epsilon
        self.kept_steps = self.kept_steps + 1 if kept_eps else 0
        gain = {"min": gain_min, "dense": 1.0}[path]
        self.previous = (cf, gain)
        self.log.append({"step": self.step, "cf": cf, "path": path, "gain_min": gain_min, "gain_c": gain_c,
                         "theta_min": theta_min, "candidate_cf": theta_c,
                         "step_seconds": previous_seconds if previous_seconds > 0 else None})
        self.totals["paths"][path] += 1
        self.totals["cf_steps"][cf] = self.totals["cf_steps"].get(cf, 0) + 1
        self.step += 1
        if self.step % self.spec.window == 0:
            self._end_window(gain_min)
        self.planned = self._next_path()
        return path, cf, gain_min, gain_c

    def _next_path(self):
        """The next step's path from theta_min's smoothed gain (module docstring, 2.)."""
        if self.settled and self.theta_ideal <= 1.0:  # settled on dense
            return "dense", 1.0
        gain_min = self.gain(self.theta_min)
        if gain_min is None or gain_min >= self.spec.epsilon or self.rung > 0:
            return "min", self.theta_min
        return "dense", 1.0

    def step_ended(self):
        """This rank's step ends (its averages are written): its time since the previous end is the step's."""
        now = time.perf_counter()
        self.last_seconds = now - self.ended_at if self.ended_at is not None else 0.0
        self.ended_at = now

    def previous_step_seconds(self):
        """This rank's time of the last finished step (0: unknown). The adapters average it over ranks with the
        next step's norms and pass it to decide()."""
        return self.last_seconds

    def forget_step_time(self):
        """The steps around this one went dense because a rank joined, with no decision: record no throughput
        until a decided step has been timed from end to end."""
        self.previous, self.ended_at, self.last_seconds = None, None, 0.0

    def throughput_table(self):
        """{cf sent: (mean gain x steps/s, steps recorded)}: what the settling rule compares."""
        return {cf: (total / count, count) for cf, (total, count) in sorted(self.throughput.items())}

    def observations(self):
        """What compression_stats() shows of the controller: the log of the last `window` steps, the totals since
        the start (steps per path, steps per CF sent, the mean CF), the throughput table it settles from, the CF
        it settled on (None while exploring) and the path and CF planned for the next step."""
        steps = sum(self.totals["cf_steps"].values())
        mean_cf = sum(cf * n for cf, n in self.totals["cf_steps"].items()) / steps if steps else None
        return {"log": [dict(e) for e in self.log], "throughput": self.throughput_table(),
                "theta_ideal": self.theta_ideal, "planned": {"path": self.planned[0], "cf": self.planned[1]},
                "totals": {"paths": dict(self.totals["paths"]),
                           "cf_steps": dict(sorted(self.totals["cf_steps"].items())), "mean_cf": mean_cf}}

    def _end_window(self, gain_min):
        """The window's end (module docstring, 3.): settle, climb a rung, or step down one."""
        climbed, self.kept_steps = self.kept_steps >= max(1, self.spec.window // 2), 0
        if not self.settled:
            table = sorted(((t, cf) for cf, (t, _) in self.throughput_table().items()), reverse=True)
            if self.spec.omega > 0 and len(table) >= 2:
                (t_a, cf_a), (t_b, cf_b) = table[0], table[1]
                if t_a > 0 and (t_a - t_b) / t_a <= self.spec.omega:
                    self.theta_ideal = min(cf_a, cf_b)
                    if self.theta_ideal in self.ladder:  # dense (1) is no rung
                        self.rung = self.ladder.index(self.theta_ideal)
                    return
            if climbed:
                self.rung += 1
                return
        if self.rung > 0 and gain_min is not None and gain_min < self.spec.epsilon:
            self.rung -= 1
            if self.settled:
                self.theta_ideal = self.theta_min

    # ---------------------------------------------------------------------------------------- checkpointing
    def state(self):
        return {"rung": self.rung, "kept_steps": self.kept_steps, "theta_ideal": self.theta_ideal,
                "alpha": self.alpha, "ewma_ef": self.ewma_ef,
                "ewma_kept": [[cf, v] for cf, v in sorted(self.ewma_kept.items())], "step": self.step,
                "planned": list(self.planned),
                "throughput": [[cf, total, count] for cf, (total, count) in sorted(self.throughput.items())],
                "previous": None if self.previous is None else list(self.previous),
                "totals": {"paths": dict(self.totals["paths"]),
                           "cf_steps": [[cf, n] for cf, n in sorted(self.totals["cf_steps"].items())]}}

    def load_state(self, state):
        self.rung, self.kept_steps = int(state["rung"]), int(state["kept_steps"])
        self.theta_ideal = None if state["theta_ideal"] is None else float(state["theta_ideal"])
        self.alpha, self.step = float(state["alpha"]), int(state["step"])
        self.ewma_ef = None if state["ewma_ef"] is None else float(state["ewma_ef"])
        self.ewma_kept = {float(cf): float(v) for cf, v in state["ewma_kept"]}
        self.planned = (str(state["planned"][0]), float(state["planned"][1]))
        self.throughput = {float(cf): [float(total), int(count)] for cf, total, count in state["throughput"]}
        self.previous = None if state["previous"] is None else tuple(float(v) for v in state["previous"])
        self.ended_at, self.last_seconds = None, 0.0  # the time across a restore is no step's
        self.log.clear()
        self.totals = new_totals()
        self.totals["paths"].update({k: int(v) for k, v in state["totals"]["paths"].items()})
        self.totals["cf_steps"] = {float(cf): int(n) for cf, n in state["totals"]["cf_steps"]}


class GravacRecord(Record):
    """One tensor's GraVAC step: g_ef, its selection at theta_min (sent) and its three squared norms."""

    __slots__ = ("flat", "candidates", "energy")


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

    def __init__(self, spec, ctx, sizes_):
        super().__init__(spec, ctx, sizes_)
        be = ctx.be
        self.codec = ErrorFeedback(TopKCodec(spec, ctx))
        self.controller = GravacController(spec, be.nranks)
        self.be, self.nranks = be, be.nranks
        self.step_plan = None  # (theta_min, theta_c, path index, cf) of the step being launched
        self.readings = None  # the last step's averaged readings in flight (backends that carry futures)
        self.step_sizes = list(self.sizes)  # the sizes of the tensors this step compresses
        self.choose(spec, self.sizes, spec.min_cf)

    def launch(self, be, item):
        item.kind = "payload"
        count_dense(self.ctx, item)
        theta_min, theta_c, path, _ = self._step(be)
        k = be.kernels
        with self.ctx.timed("compress_seconds"):
            item.work.flat, sumsq = self.codec.accumulate(be, item, be.flat32(item.grad))
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
        with self.ctx.timed("compress_seconds"):
            payload, _ = self.codec.encode(be, item, item.work.flat, candidates=item.work.candidates)
        size = be.size(payload)
        return be.allgather(payload, be.name("topk.min", item)), be.nothing("float32"), \
            be.stack([size, size * (be.nranks - 1)], "float64")

    def _send_dense(self, be, item):
        """GraVAC's dense path: g_ef by allreduce, after which r = 0."""
        nbytes = 4 * item.numel
        return be.nothing("uint8"), send_dense(be, item, item.work.flat, self.codec, "topk.dense"), \
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
        release(self)
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
            release(self)
            self._agree(self.be, self.be.wait(readings), " at the previous step")

    def _decide(self, agreed):
        path, cf, gain_min, gain_c = self.controller.decide(*agreed)
        self.be.shared_state_written(self)
        self.ctx.count_decided(**self.decision_bytes(path, cf))
        theta_min, theta_c = self.controller.log[-1]["theta_min"], self.controller.log[-1]["candidate_cf"]
        self.ctx.stats.extra.update(cf=cf, path=path, gain_min=gain_min, gain_c=gain_c, theta_min=theta_min,
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
        self.ctx.count(payload_bytes=NORM_BYTES, wire_bytes=allreduce_wire_bytes(NORM_BYTES, be.nranks))
        if self.sparse is not None:
            results = be.switch(path, [lambda: self._sparse(be, items), lambda: self._dense(be, items)])
            n = len(items)
            averages, flags = results[:n], results[n:2 * n]
            payload_bytes, wire_bytes = be.unstack(results[2 * n], 2)
            self.ctx.count_runtime(payload_bytes=payload_bytes, wire_bytes=wire_bytes)
        else:
            averages, flags = self._received(be, items, path)
        for item, avg, bad in zip(items, averages, flags):
            require_decoded(be, self.ctx, self.codec, item, bad)
            be.write(item, avg)
            self.ctx.require(be.all_finite(avg), f"{item.name!r} {self.codec.nonfinite}")
        be.host(self._step_ended, [], ("int32",))
        if be.carries_futures:
            self.readings = agreement
            hold(self)  # taken in at the next step, or at exit (in_flight.py)
        else:
            self._agree(be, be.wait(agreement), "")  # a graph's tensors end with the step

    def _agree(self, be, agreed, when):
        """The controller takes in the rank-averaged readings and plans the next step, unless they are not finite
        (a NaN/Inf gradient: the step's error, raised on every rank)."""
        self.ctx.require(be.all_finite(agreed), f"every tensor (the squared norms of the gradients{when} are not "
                                                f"finite on some rank)")
        if self.ctx.failed():
            return
        be.host(self._decide, [self.ctx.guarded(agreed)], ("int32",))

    def _received(self, be, items, path):
        """Wait for each tensor's collective started in launch() and decode it: the averages and the bad-rank
        flags; its bytes are counted as sent."""
        averages, flags, sent = [], [], []
        for item in items:
            gathered_future, dense_future, nbytes = item.future
            gathered, dense = be.wait(gathered_future), be.wait(dense_future)
            sent.append(nbytes)
            with self.ctx.timed("decompress_seconds"):
                avg, bad = be.switch(path, [lambda: self._decode(be, item, gathered), lambda: [dense, be.no_flag()]])
            averages.append(avg)
            flags.append(bad)
        if sent:
            payload_bytes, wire_bytes = be.unstack(be.sum(sent), 2)
            self.ctx.count_runtime(payload_bytes=payload_bytes, wire_bytes=wire_bytes)
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
        sent = [send_dense(be, item, item.work.flat, self.codec, "topk.dense") for item in items]
        nbytes = 4 * sum(self.step_sizes)
        return [be.wait(f) for f in sent] + [be.no_flag() for _ in items] + \
            [be.stack([nbytes, allreduce_wire_bytes(nbytes, be.nranks)], "float64")]


class AdaptiveTopK(AutoPacking, CompressorSpec):
    """GraVAC (Tyagi & Swany, "GraVAC: Adaptive Compression for Communication-Efficient Distributed DL Training",
    IEEE CLOUD 2023), Algorithm 1: top-k with error feedback whose compression factor CF (dense size / sent size)
    moves during training, driven by the measured compression gain. See horovod_ext.compressors.gravac for the
    controller, its math and its tuning guide.

    Args:
        min_cf, max_cf: the range of CF (>= 1, min_cf <= max_cf).
        epsilon: the smallest compression gain, sqrt(EWMA(|C(g_ef)|^2) / EWMA(|g_ef|^2)), a CF may have; in (0, 1].
        window: steps between CF moves (>= 1): at a window's end theta_min climbs to a candidate that kept epsilon
            over the window's second half, or steps down one rung if it no longer keeps epsilon itself.
        omega: relative tolerance: settle on the lower of the two CFs whose compression throughputs are highest
            when those are within omega; [0, 1). The throughputs are measured step times, so with omega > 0 two
            runs of a seeded script can settle at different windows; omega=0 never settles, and every decision then
            reads the gains alone: a seeded run repeats bit for bit.
        policy: the ladder of CFs the candidate climbs: "exponential" (min_cf x 2, 4, 16, 256, each scale the
            square of the last: CF 10, 20, 40, 160, 1000 from min_cf 10) or "geometric" (doubled each rung).
        value_dtype, packing, transport, rebalance_every: the payload's values and index coding and how the
            payloads travel, as Compression.topk's ("auto" plans its bytes at min_cf).

    Defaults. epsilon 0.7 is the lower of the two values the paper reports (0.7, 0.9; the authors' code: 0.75):
    with error feedback, top-k at CF 10 keeps a gain between those two on the models measured, each of which
    trains at CF 10 as well as dense, so a higher epsilon sends dense what compresses without loss. omega 0.05 is
    the authors' code's. window 100 steps lets the CF climb one rung per window, 20, 40, 160 and 1000 after 100,
    200, 300 and 400 steps at the earliest (the paper's 500 was chosen for runs of tens of thousands of steps: on
    runs of a few hundred the CF could not move); it is two EWMA time constants (1 / a = 100 / N steps) at 2 ranks
    and eight at 8, so a candidate is judged on readings that have mostly forgotten its predecessor's. The
    measurements behind them: benchmarks/RESULTS.md, section "Measurements behind GraVAC's gain and defaults".
    """

    encodes_alone = False  # see CompressorSpec

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

    def payload_bytes(self, shape, cf=None):
        """Top-k's payload at compression factor cf (topk.payload_bytes_at): the CF moves during training, so
        the size is a step's at that CF; None (the default) stands for min_cf, where every run starts and where
        transport="auto" plans its bytes."""
        return payload_bytes_at(self, shape, self.min_cf if cf is None else cf)
