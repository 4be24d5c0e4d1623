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
  the residual grows until what top-k sends carries the incoming mass, so |C(g_ef)| / |g| rises with the CF: on the
  digits MLP sending CF 1000 it read 3.7 (CF 160) to 10 (CF 10), far above any epsilon, and would have driven every
  model to max_cf (a small CNN loses 12 points of accuracy at a static CF 1000). |C(g_ef)| / |g_ef| stays in [0, 1]
  and falls with the CF whatever was sent before: 0.74-0.86 at CF 10, 0.59-0.76 at CF 20, 0.14-0.3 at CF 1000 on
  the digits MLP and CNN (measured).
- The gain is a ratio of norms (as in the authors' code) rather than of squared norms, so that epsilon reads on the
  paper's scale (it reports 0.7 and 0.9; the authors' code defaults to 0.75).
- The CF sent is the rung, moved at a window's end, where the paper sends the candidate on any step whose gain
  keeps epsilon, raises theta_min when the two gains are within omega, and otherwise moves the candidate on by the
  policy whatever it read. Under error feedback the gain falls with the CF (below), so the two gains are never
  within omega, and two things went wrong. The candidate ran past the CFs that kept epsilon to ones that did not,
  after which every step fell back to min_cf: on the nplm at epsilon 0.5 the candidates 20 and 40 kept it and were
  sent for a window each, then 160 and 1000 did not, and CF 10 was sent for the remaining 1,774 of 2,000 steps.
  And a candidate whose gain sat at epsilon was sent on some steps and not others: on the digits MLP the CF
  switched between 10 and 20 25 times in 315 steps, and ended 1.8 points below dense where static top-k at 10
  and at 20 each ended within 0.25 (benchmarks/RESULTS.md). A candidate that failed is measured again rather than
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
                "totals": {"paths": dict(self.totals["paths"]), "cf_steps": dict(sorted(self.totals["cf_steps"].items())),
                           "mean_cf": mean_cf}}

    def _end_window(self, gain_min):
        """The window's end (module docstring, 3.): settle, climb a rung, or step down one."""
        climbed, self.kept_steps = self.kept_steps >= max(1, self.spec.window // 2), 0
        if not self.settled:
            table = sorted(((t, cf) for cf, (t, _) in self.throughput_table().items()), reverse=True)
            if len(table) >= 2:
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
