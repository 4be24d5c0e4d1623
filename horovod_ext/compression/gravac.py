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
    theta_c: the paper's multi-level compression);
 2. send the candidate if gain(theta_c) >= epsilon, else theta_min if gain(theta_min) >= epsilon, else the dense
    g_ef (and reset the residual);
 3. at the end of each window, while exploring: if the two highest throughputs in the table are within omega
    (relative), the CF has saturated: settle on the lower of the two CFs (theta_ideal; more gain for the same
    speed) and stop exploring. Else raise theta_min to theta_c when |gain_min - gain_c| / gain_min <= omega and
    gain_c >= epsilon, and scale theta_s by the policy: "exponential" squares it (2, 4, 16, 256: candidates 20,
    40, 160, 1000 from min_cf 10), "geometric" doubles it. The candidate never exceeds max_cf.
 After settling theta_min stays the fallback: a step whose theta_ideal fails epsilon sends theta_min if that keeps
 epsilon, and only then goes dense (the paper's Algorithm 1 keeps theta_min; replacing it by theta_ideal would make
 every failed check dense).

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
- A CF's EWMA restarts when that CF changes (the old CF's readings say nothing about the new one).
- Steps whose time is unknown (the first, the first after a restore, the first after a step every rank sent dense
  because a rank joined) record no throughput.

Tuning guide: epsilon is the gain a CF must keep (lower it to compress harder); window is how many steps each
candidate is tried (the EWMA needs about 100 / N steps to forget); omega is the tolerance of both comparisons.
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
    """Algorithm 1 over rank-averaged scalars; see the module docstring for the math and the choices."""

    def __init__(self, spec, nranks=1):
        self.spec = spec
        self.alpha = ewma_weight(nranks)
        self.theta_min = float(spec.min_cf)
        self.theta_s = 2.0
        self.theta_ideal = None  # set once the throughput saturates (settled)
        self.ewma = {"ef": None, "min": None, "candidate": None}
        self.ewma_cf = {"min": None, "candidate": None}  # the CF each EWMA belongs to
        self.throughput = {}  # cf sent -> [sum of gain / t_iter, steps]
        self.previous = None  # (cf, gain) of the last decision, until its step time is known
        self.decided_at = None  # this rank's clock at the last decision (not state: a restore starts it again)
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

    # -------------------------------------------------------------------------------------------- a decision
    def _smooth(self, key, value, cf=None):
        if cf is not None and self.ewma_cf[key] != cf:
            self.ewma[key], self.ewma_cf[key] = None, cf
        old = self.ewma[key]
        self.ewma[key] = value if old is None else (1 - self.alpha) * old + self.alpha * value
        return self.ewma[key]

    def decide(self, norm_ef, norm_min, norm_c, step_seconds):
        """The path of this step from the rank-averaged squared norms |g_ef|^2, |C_min(g_ef)|^2, |C_c(g_ef)|^2 and
        the rank-averaged seconds since the previous decision (<= 0: unknown). Returns (path, cf sent, gain_min,
        gain_c)."""
        values = (norm_ef, norm_min, norm_c, step_seconds)
        if not all(math.isfinite(v) for v in values):
            raise FloatingPointError("NaN or Inf in the gradients (their squared norms are not finite)")
        if self.previous is not None and step_seconds > 0:
            cf, gain = self.previous
            entry = self.throughput.setdefault(cf, [0.0, 0])
            entry[0] += gain / step_seconds
            entry[1] += 1
        theta_min, theta_c = self.cfs()
        ef = self._smooth("ef", norm_ef)
        kept_min = self._smooth("min", norm_min, theta_min)
        kept_c = self._smooth("candidate", norm_c, theta_c)
        gain_min = math.sqrt(kept_min / ef) if ef > 0 else 1.0
        gain_c = math.sqrt(kept_c / ef) if ef > 0 else 1.0
        eps = self.spec.epsilon
        if theta_c <= 1.0:  # settled on dense
            path, cf, gain = "dense", 1.0, 1.0
        elif gain_c >= eps and theta_c != theta_min:
            path, cf, gain = "candidate", theta_c, gain_c
        elif gain_min >= eps:
            path, cf, gain = "min", theta_min, gain_min
        else:
            path, cf, gain = "dense", 1.0, 1.0
        self.previous, self.decided_at = (cf, gain), time.perf_counter()
        self.log.append({"step": self.step, "cf": cf, "path": path, "gain_min": gain_min, "gain_c": gain_c,
                         "theta_min": theta_min, "candidate_cf": theta_c,
                         "step_seconds": step_seconds if step_seconds > 0 else None})
        self.totals["paths"][path] += 1
        self.totals["cf_steps"][cf] = self.totals["cf_steps"].get(cf, 0) + 1
        self.step += 1
        if self.step % self.spec.window == 0 and not self.settled:
            self._end_window(gain_min, gain_c)
        return path, cf, gain_min, gain_c

    def seconds_since_decision(self):
        """This rank's step time so far: wall seconds since its last decision (0: unknown). The adapters average it
        over ranks with the norms and pass it to decide()."""
        return time.perf_counter() - self.decided_at if self.decided_at is not None else 0.0

    def forget_step_time(self):
        """The next step's time does not belong to this decision (the steps between went dense because a rank
        joined): record no throughput for it."""
        self.previous = self.decided_at = None

    def throughput_table(self):
        """{cf sent: (mean gain x steps/s, steps recorded)}: what the settling rule compares."""
        return {cf: (total / count, count) for cf, (total, count) in sorted(self.throughput.items())}

    def observations(self):
        """What compression_stats() shows of the controller: the log of the last `window` steps, the totals since
        the start (steps per path, steps per CF sent, the mean CF), the throughput table it settles from and the
        CF it settled on (None while exploring)."""
        steps = sum(self.totals["cf_steps"].values())
        mean_cf = sum(cf * n for cf, n in self.totals["cf_steps"].items()) / steps if steps else None
        return {"log": [dict(e) for e in self.log], "throughput": self.throughput_table(),
                "theta_ideal": self.theta_ideal,
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
        if gain_min > 0 and abs(gain_min - gain_c) / gain_min <= self.spec.omega and gain_c >= self.spec.epsilon:
            self.theta_min = theta_c
        grown = self.theta_s ** 2 if self.spec.policy == "exponential" else self.theta_s * 2
        self.theta_s = max(1.0, min(grown, self.spec.max_cf / self.theta_min))  # the candidate stops at max_cf

    # ---------------------------------------------------------------------------------------- checkpointing
    def state(self):
        return {"theta_min": self.theta_min, "theta_s": self.theta_s, "theta_ideal": self.theta_ideal,
                "alpha": self.alpha, "ewma": dict(self.ewma), "ewma_cf": dict(self.ewma_cf), "step": self.step,
                "throughput": [[cf, total, count] for cf, (total, count) in sorted(self.throughput.items())],
                "previous": None if self.previous is None else list(self.previous),
                "totals": {"paths": dict(self.totals["paths"]),
                           "cf_steps": [[cf, n] for cf, n in sorted(self.totals["cf_steps"].items())]}}

    def load_state(self, state):
        self.theta_min, self.theta_s = float(state["theta_min"]), float(state["theta_s"])
        self.theta_ideal = None if state["theta_ideal"] is None else float(state["theta_ideal"])
        self.alpha, self.step = float(state["alpha"]), int(state["step"])
        self.ewma = {k: None if v is None else float(v) for k, v in state["ewma"].items()}
        self.ewma_cf = {k: None if v is None else float(v) for k, v in state["ewma_cf"].items()}
        self.throughput = {float(cf): [float(total), int(count)] for cf, total, count in state["throughput"]}
        self.previous = None if state["previous"] is None else tuple(float(v) for v in state["previous"])
        self.decided_at = None  # the time across a restore is no step's
        self.log.clear()
        self.totals = new_totals()
        if "totals" in state:
            self.totals["paths"].update({k: int(v) for k, v in state["totals"]["paths"].items()})
            self.totals["cf_steps"] = {float(cf): int(n) for cf, n in state["totals"]["cf_steps"]}
        else:  # a checkpoint that held the whole log
            for entry in state.get("log", []):
                self.totals["paths"][entry["path"]] += 1
                self.totals["cf_steps"][float(entry["cf"])] = self.totals["cf_steps"].get(float(entry["cf"]), 0) + 1
