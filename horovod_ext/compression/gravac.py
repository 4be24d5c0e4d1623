"""GraVAC's controller (Tyagi & Swany, IEEE CLOUD 2023, Algorithm 1), framework-free, over scalars.

Tuning guide. GraVAC picks the compression factor (CF = dense size / sent size) from the *compression gain*, the
share of the gradient's energy a compressed gradient keeps:

    gain(theta) = EWMA(|C_theta(g_ef)|^2) / EWMA(|g_ef|^2)   (EWMA weight 0.1 on each new step, sums over tensors)

- epsilon is the gain a CF must keep to be used (0.9: keep 90% of the energy). Lower it to compress harder early
  in training, when gradients are dense in information and gains are low.
- window is how many steps each candidate CF is tried before the controller moves; a few hundred steps let the
  EWMA settle. The CF only moves at window ends.
- omega is the tolerance of both comparisons below; 0.01 is strict, 0.1 settles sooner.

Each step, with theta_min the current minimum CF and theta_c = min(theta_min * theta_s, max_cf) the candidate:
 1. every tensor is compressed at theta_min (top-k) and that result again at theta_c (top-k of a top-k, which equals
    top-k at theta_c);
 2. the squared norms |g_ef|^2, |g_min|^2, |g_c|^2 (summed over tensors) and the step time are averaged over ranks
    (one small allreduce), so every rank takes the same decision;
 3. send the candidate if gain_c >= epsilon, else theta_min if gain_min >= epsilon, else the dense g_ef (and reset
    the residual);
 4. record the compression throughput, steps/s x gain of what was sent (samples/s at a fixed batch size), for the
    candidate CF;
 5. at the end of each window: if the last two candidates' throughputs are within omega (relative), settle on the
    lower of the two CFs for the rest of training; else raise theta_min to theta_c when
    |gain_min - gain_c| / gain_min <= omega, and move theta_s by the policy: "exponential" squares it (2, 4, 16,
    256: candidates 20, 40, 160, 1000 from min_cf 10), "geometric" doubles it. The candidate never exceeds max_cf.
The state (theta_min, theta_s, EWMAs, throughputs, the log) is a plain dict in state_dict().
"""
import math

EWMA_WEIGHT = 0.1
PATHS = ("candidate", "min", "dense")


class GravacController:
    def __init__(self, spec):
        self.spec = spec
        self.theta_min = float(spec.min_cf)
        self.theta_s = 2.0
        self.settled = False
        self.ewma = None  # [ef, min, candidate]
        self.step = 0
        self.window_throughput = []  # this window's steps/s x gain
        self.history = []  # (candidate cf, mean throughput) per finished window
        self.log = []  # per step: step, cf sent, path, gain_min, gain_c, theta_min, candidate

    # ------------------------------------------------------------------------------------------------ the CFs
    def candidate_cf(self):
        return self.theta_min if self.settled else min(self.theta_min * self.theta_s, self.spec.max_cf)

    def cfs(self):
        """(theta_min, theta_c) the adapter compresses at this step."""
        return self.theta_min, self.candidate_cf()

    # -------------------------------------------------------------------------------------------- a decision
    def decide(self, norm_ef, norm_min, norm_c, step_seconds):
        """The path of this step from the rank-averaged squared norms; returns (path, cf sent, gain_min, gain_c)."""
        values = (norm_ef, norm_min, norm_c)
        if not all(math.isfinite(v) for v in values):
            raise FloatingPointError("NaN or Inf in the gradients (their squared norms are not finite)")
        if self.ewma is None:
            self.ewma = list(values)
        else:
            self.ewma = [(1 - EWMA_WEIGHT) * e + EWMA_WEIGHT * v for e, v in zip(self.ewma, values)]
        ef = self.ewma[0]
        gain_min = self.ewma[1] / ef if ef > 0 else 1.0
        gain_c = self.ewma[2] / ef if ef > 0 else 1.0
        theta_min, theta_c = self.cfs()
        if gain_c >= self.spec.epsilon:
            path, cf, gain = "candidate", theta_c, gain_c
        elif gain_min >= self.spec.epsilon:
            path, cf, gain = "min", theta_min, gain_min
        else:
            path, cf, gain = "dense", 1.0, 1.0
        if step_seconds > 0:
            self.window_throughput.append(gain / step_seconds)
        self.log.append({"step": self.step, "cf": cf, "path": path, "gain_min": gain_min, "gain_c": gain_c,
                         "theta_min": theta_min, "candidate_cf": theta_c})
        self.step += 1
        if self.step % self.spec.window == 0:
            self._end_window(gain_min, gain_c)
        return path, cf, gain_min, gain_c

    def _end_window(self, gain_min, gain_c):
        theta_c = self.candidate_cf()
        throughput = sum(self.window_throughput) / len(self.window_throughput) if self.window_throughput else 0.0
        self.window_throughput = []
        if self.settled:
            return
        self.history.append((theta_c, throughput))
        if len(self.history) >= 2:
            (cf_a, t_a), (cf_b, t_b) = self.history[-2], self.history[-1]
            if cf_a != cf_b and max(t_a, t_b) > 0 and abs(t_a - t_b) / max(t_a, t_b) <= self.spec.omega:
                self.theta_min, self.settled = min(cf_a, cf_b), True
                return
        if gain_min > 0 and abs(gain_min - gain_c) / gain_min <= self.spec.omega:
            self.theta_min = theta_c
        grown = self.theta_s ** 2 if self.spec.policy == "exponential" else self.theta_s * 2
        self.theta_s = max(1.0, min(grown, self.spec.max_cf / self.theta_min))  # the candidate stops at max_cf

    # ---------------------------------------------------------------------------------------- checkpointing
    def state(self):
        return {"theta_min": self.theta_min, "theta_s": self.theta_s, "settled": self.settled,
                "ewma": None if self.ewma is None else list(self.ewma), "step": self.step,
                "window_throughput": list(self.window_throughput), "history": [list(h) for h in self.history],
                "log": [dict(e) for e in self.log]}

    def load_state(self, state):
        self.theta_min, self.theta_s = float(state["theta_min"]), float(state["theta_s"])
        self.settled, self.step = bool(state["settled"]), int(state["step"])
        self.ewma = None if state["ewma"] is None else [float(v) for v in state["ewma"]]
        self.window_throughput = [float(v) for v in state["window_throughput"]]
        self.history = [tuple(h) for h in state["history"]]
        self.log = [dict(e) for e in state["log"]]
