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
  actually sent (the candidate, theta_min, or 1 for dense): throughput(cf) = mean over the steps that sent cf of
  gain_sent / t_iter.

Each step, with theta_min the current minimum CF and theta_c the candidate (min(theta_min * theta_s, max_cf) while
exploring, theta_ideal once settled):
 1. every tensor is compressed at theta_min and that result again at theta_c (top-k of a top-k equals top-k at
    theta_c: the paper's multi-level compression), and sends the one the previous step's decision chose;
 2. the step's three squared norms and the previous step's time are averaged over ranks (one small allreduce that
    rides beside the payloads), and the decision for the next step is taken from them: send the candidate if
    gain(theta_c) >= epsilon, else theta_min if gain(theta_min) >= epsilon, else the dense g_ef (and reset the
    residual). A CF without a reading yet (the first step, a new candidate) is not sent: the first step sends
    theta_min, a new candidate is first measured beside theta_min;
 3. at the end of each window, while exploring: if the two highest throughputs in the table are within omega
    (relative), the CF has saturated: settle on the lower of the two CFs (theta_ideal; more gain for the same
    speed) and stop exploring. Else raise theta_min to theta_c when |gain_min - gain_c| / gain_min <= omega and
    gain_c >= epsilon, and scale theta_s by the policy: "exponential" squares it (2, 4, 16, 256: candidates 20,
    40, 160, 1000 from min_cf 10), "geometric" doubles it. The candidate never exceeds max_cf.
 After settling theta_min stays the fallback: a step whose theta_ideal fails epsilon sends theta_min if that keeps
 epsilon, and only then goes dense (the paper's Algorithm 1 keeps theta_min; replacing it by theta_ideal would make
 every failed check dense).

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
- theta_min only rises to a candidate that keeps epsilon: theta_min is the fallback, and one below epsilon would
  turn every step that misses the candidate into a dense one (with a loose omega, a run that sent CF 10 every step
  would go dense for the rest of training).
- The EWMAs are kept per CF: a CF's EWMA restarts when a new CF takes its role (the old CF's readings say nothing
  about the new one), and the candidate's carries over when theta_min rises to it (the same CF's readings).
- A step's time t_iter is measured from the end of the previous step's communication to the end of its own (rank
  local), so it is known after the step; it is averaged over ranks with the next step's norms and filed under the
  CF that step sent. Steps whose time is unknown (the first, the first after a restore, those around a step every
  rank sent dense because a rank joined) record no throughput.

Tuning guide: epsilon is the gain a CF must keep (lower it to compress harder); window is how many steps each
candidate is tried (the EWMA needs about 100 / N steps to forget; the exponential policy reaches max_cf 1000 from
min_cf 10 after four windows); omega is the tolerance of both comparisons.
The state (theta_min, theta_s, theta_ideal, EWMAs, the throughput table, running totals) is a plain dict whose size
does not grow with the steps taken. The per-step log keeps the last `window` decisions in memory (what
compression_stats() shows; a run that plots CF over training reads it after each step) and is not checkpointed:
no decision reads it.
"""
import collections
import math
import time

PATHS = ("candidate", "min", "dense")


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
        self.theta_min = float(spec.min_cf)
        self.theta_s = 2.0
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

    # ------------------------------------------------------------------------------------------------ the CFs
    def candidate_cf(self):
        return self.theta_ideal if self.settled else min(self.theta_min * self.theta_s, self.spec.max_cf)

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
        gain = {"candidate": gain_c, "min": gain_min, "dense": 1.0}[path]
        self.previous = (cf, gain)
        self.log.append({"step": self.step, "cf": cf, "path": path, "gain_min": gain_min, "gain_c": gain_c,
                         "theta_min": theta_min, "candidate_cf": theta_c,
                         "step_seconds": previous_seconds if previous_seconds > 0 else None})
        self.totals["paths"][path] += 1
        self.totals["cf_steps"][cf] = self.totals["cf_steps"].get(cf, 0) + 1
        self.step += 1
        if self.step % self.spec.window == 0 and not self.settled:
            self._end_window(gain_min, gain_c)
        self.planned = self._next_path()
        return path, cf, gain_min, gain_c

    def _next_path(self):
        """Algorithm 1's choice for the next step from the smoothed gains of its CFs (module docstring, 2.)."""
        theta_min, theta_c = self.cfs()
        eps = self.spec.epsilon
        if theta_c <= 1.0:  # settled on dense
            return "dense", 1.0
        gain_c, gain_min = self.gain(theta_c), self.gain(theta_min)
        if theta_c != theta_min and gain_c is not None and gain_c >= eps:
            return "candidate", theta_c
        if gain_min is None or gain_min >= eps:
            return "min", theta_min
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

    def _end_window(self, gain_min, gain_c):
        table = sorted(((t, cf) for cf, (t, _) in self.throughput_table().items()), reverse=True)
        if len(table) >= 2:
            (t_a, cf_a), (t_b, cf_b) = table[0], table[1]
            if t_a > 0 and (t_a - t_b) / t_a <= self.spec.omega:
                self.theta_ideal = min(cf_a, cf_b)
                return
        theta_c = self.candidate_cf()
        if gain_min and gain_c is not None and abs(gain_min - gain_c) / gain_min <= self.spec.omega \
                and gain_c >= self.spec.epsilon:
            self.theta_min = theta_c
        grown = self.theta_s ** 2 if self.spec.policy == "exponential" else self.theta_s * 2
        self.theta_s = max(1.0, min(grown, self.spec.max_cf / self.theta_min))  # the candidate stops at max_cf

    # ---------------------------------------------------------------------------------------- checkpointing
    def state(self):
        return {"theta_min": self.theta_min, "theta_s": self.theta_s, "theta_ideal": self.theta_ideal,
                "alpha": self.alpha, "ewma_ef": self.ewma_ef,
                "ewma_kept": [[cf, v] for cf, v in sorted(self.ewma_kept.items())], "step": self.step,
                "planned": list(self.planned),
                "throughput": [[cf, total, count] for cf, (total, count) in sorted(self.throughput.items())],
                "previous": None if self.previous is None else list(self.previous),
                "totals": {"paths": dict(self.totals["paths"]),
                           "cf_steps": [[cf, n] for cf, n in sorted(self.totals["cf_steps"].items())]}}

    def load_state(self, state):
        self.theta_min, self.theta_s = float(state["theta_min"]), float(state["theta_s"])
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
