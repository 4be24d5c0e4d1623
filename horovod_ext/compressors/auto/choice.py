"""Compression.auto's chooser, framework-free: from measured inputs, each tensor's candidate with the least predicted
step time among those whose accuracy guard holds.

The step model (TernGrad's, as horovod_ext.perfmodel.predict, made per tensor). Tensor t sent with candidate c puts
bytes_{t,c} on a collective of kind k(c) ("allreduce", "allgather", or "factors": PowerSGD's two allreduces) and
spends kernel_{t,c} seconds encoding and decoding on this rank:

    step(A) = compute + sum_t kernel_{t,A(t)} + check(A) + max(0, comm(A) - overlap)
    comm(A) = sum over the candidates c that A uses of latency_{k(c)} + sum_t slope_{k(A(t))} * bytes_{t,A(t)}

latency_k and slope_k are the link's, fitted per collective kind from a probe of this job's own collectives at this
number of ranks (Link.fit: time = latency + slope * bytes per rank); a method's latency is paid once per step
because Horovod fuses the step's collectives of one method (its tensor fusion), and a payload method's join check
(one allreduce's latency before the step's first collective) is added where one is used. Kernels run on the thread
(or stream) that runs backward, so they never overlap it; communication runs on Horovod's background thread behind
what is left of backward once the first gradient is ready (overlap: measured, the seconds between the step's first
and last gradient, 0 where every gradient is sent at once, as in TensorFlow).

The accuracy guard (GraVAC's compression gain, Tyagi & Swany 2023, made method-independent): a candidate's gain on a
tensor is the cosine between x = g + r (the gradient with its error-feedback residual) and C(x), what the candidate
sends of it,

    gain = <x, C(x)> / (|x| |C(x)|)

which is GraVAC's |C(x)| / |x| wherever C is a projection (top-k keeps coordinates, PowerSGD's P P^T M), and for an
unbiased quantizer (TernGrad) the cosine of its draw. A candidate qualifies for a tensor while its gain, averaged
over the window, is at least epsilon; "none" (dense float32) always qualifies. Off force an error-feedback
candidate's gain is at most what it kept when last in force, for HELD_WINDOWS windows (``guard_gain``).

The solver: coordinate descent from the current assignment, largest tensor first (ties by name), each tensor taking
the qualifying candidate that lowers step(A) most (ties: the earlier candidate, the denser by the order given),
until a pass changes nothing. A new assignment replaces the current one only where it is predicted at least
`margin` faster (no oscillation on noise; AUTO.md), except that a tensor whose candidate lost its guard moves at once.
Deterministic: every rank that holds the same inputs takes the same decision.

Measured steps overrule predicted ones (``measured_choice``). The model misses what it does not hold (a method's
Python and framework overhead per step, its collectives' negotiation), so each window also measures the step of the
assignment in force (the median interval between step ends, averaged over ranks). The next assignment is the one
with the least estimate among the current one, the model's proposal and every assignment measured before that still
qualifies: a measured assignment's estimate is its measured step (the mean over its windows timed in the last
MEASURED_WINDOWS of method.py, or its last timed window where it has none there: method.kept_timings), any
other's its predicted step times the largest measured / predicted among the measured ones (the model's error on an
assignment not measured is unknown: the least favourable error seen keeps a prediction from displacing a measured
step on the model's bias alone). It replaces the current one where its estimate is at least `margin` lower and,
where both were timed, lower by NOISE_Z standard errors of the difference of their means, the windows' spread
pooled over the assignments timed twice or more (``beyond_noise``). In the TRIALS windows after the first, the
TRIALS best uniform assignments (one candidate for every tensor it is allowed on, by prediction: the best static
methods as the model sees them) each run for a window where they differ from the choice in force and were not
measured, so that a mixed choice stands only where it measured faster than the best single methods. After the
return from the last trial a switch is made only when the same assignment is chosen at two window ends in a row
(``confirmed``); a tensor whose guard fails moves at once.
"""
import math
import statistics
from dataclasses import dataclass, field

KINDS = ("allreduce", "allgather", "factors")
TRIALS = 2  # the best uniform assignments (by prediction) each run for a window after the first one
NOISE_Z = 2.0  # a move between two timed assignments needs their mean steps this many standard errors apart
HELD_WINDOWS = 25  # a candidate's gain in force bounds its gain off force for this many windows (guard_gain)


@dataclass
class Link:
    """time = latency + slope * bytes per rank, per collective kind (seconds, seconds per byte), at this N."""
    latency: dict = field(default_factory=dict)
    slope: dict = field(default_factory=dict)

    @staticmethod
    def fit(samples):
        """From {kind: [(bytes per rank, seconds), ...]}: the line through the smallest and the largest size's
        median times (slope >= 0); "factors" is two allreduces. Where that line passes below zero at no bytes (a
        shaper's burst carries the small sizes at line rate, so time is convex in bytes), the latency is the
        smallest size's median time: a collective's fixed cost is never taken as nothing."""
        link = Link()
        for kind, points in samples.items():
            by_size = {}
            for nbytes, seconds in points:
                by_size.setdefault(float(nbytes), []).append(float(seconds))
            sizes = sorted(by_size)
            if not sizes:
                raise ValueError(f"Link.fit: no samples of {kind!r}")
            med = [statistics.median(by_size[s]) for s in sizes]
            slope = (med[-1] - med[0]) / (sizes[-1] - sizes[0]) if len(sizes) > 1 else med[0] / max(sizes[0], 1.0)
            slope = max(slope, 0.0)
            intercept = med[0] - slope * sizes[0]
            link.latency[kind], link.slope[kind] = (intercept if intercept > 0 else med[0]), slope
        if "allreduce" in link.latency and "factors" not in link.latency:
            link.latency["factors"], link.slope["factors"] = 2 * link.latency["allreduce"], link.slope["allreduce"]
        return link

    def seconds(self, kind, nbytes):
        return self.latency[kind] + self.slope[kind] * nbytes

    def as_list(self):
        return [v for kind in KINDS for v in (self.latency.get(kind, 0.0), self.slope.get(kind, 0.0))]

    @staticmethod
    def from_list(values):
        link = Link()
        for j, kind in enumerate(KINDS):
            link.latency[kind], link.slope[kind] = float(values[2 * j]), float(values[2 * j + 1])
        return link


@dataclass
class Option:
    """One candidate on one tensor: its collective kind, bytes per rank, kernel seconds per step and gain."""
    kind: str
    nbytes: float
    kernel: float
    gain: float
    always: bool = False  # qualifies whatever its gain ("none")
    join_check: bool = False  # its method asks whether a rank has joined before each step (a payload's)


def guard_gain(gain, held, in_force, windows_since):
    """The gain the guard reads for a candidate on a tensor: `gain`, the window's mean, where the candidate is in
    force or `held` (its mean over the last window it was in force, `windows_since` windows ago) is None or older
    than HELD_WINDOWS; else min(gain, held).

    Off force an error-feedback candidate is measured on g plus the residual of the candidate in force (none at all
    once a carried residual was sent), not on its own residual, which builds up again once it is back in force: the
    off-force gain overstates it (benchmarks/RESULTS.md, section "Compression.auto's guard in force: the gains, epsilon
    0.4, and time to the target"). Without the bound a tensor the guard moved off a candidate moves back onto it at the
    next window end, and off again."""
    if gain is None or held is None or in_force or windows_since > HELD_WINDOWS:
        return gain
    return min(gain, held)


def qualifies(option, epsilon):
    return option.always or (option.gain is not None and math.isfinite(option.gain) and option.gain >= epsilon)


class Prediction:
    """step(A) of an assignment, kept incrementally: the kernels' sum, the bytes' time, and the tensors per
    (candidate, kind): each method in use pays its collective's latency once per step (Horovod fuses one method's
    collectives of one dtype and kind; two methods negotiate and fuse apart), and a method that asks whether a rank
    has joined (payload compressors) adds that allreduce's latency before the step, where nothing hides it."""

    def __init__(self, options, assignment, link, compute, overlap):
        self.options, self.link, self.compute, self.overlap = options, link, compute, overlap
        self.kernel, self.transfer, self.users, self.checks = 0.0, 0.0, {}, 0
        for t, c in enumerate(assignment):
            self._add(options[t][c], c, 1)

    def _add(self, o, c, sign):
        self.kernel += sign * o.kernel
        self.transfer += sign * self.link.slope[o.kind] * o.nbytes
        key = (c, o.kind)
        self.users[key] = self.users.get(key, 0) + sign
        self.checks += sign * o.join_check

    def step(self):
        comm = self.transfer + sum(self.link.latency[kind] for (_, kind), n in self.users.items() if n > 0)
        check = self.link.latency["allreduce"] if self.checks > 0 else 0.0
        return self.compute + self.kernel + check + max(0.0, comm - self.overlap)

    def moved(self, t, old, new):
        """step(A) with tensor t moved from candidate old to new (A itself unchanged)."""
        if old == new:
            return self.step()
        self.move(t, old, new)
        out = self.step()
        self.move(t, new, old)
        return out

    def move(self, t, old, new):
        self._add(self.options[t][old], old, -1)
        self._add(self.options[t][new], new, 1)


def predicted_step(options, assignment, link, compute, overlap):
    return Prediction(options, assignment, link, compute, overlap).step()


def guarded(options, assignment, epsilon):
    """The assignment with every tensor whose candidate lost its guard moved to the nearest denser candidate that
    qualifies: the one with the fewest bytes among those with at least as many ("none", candidate 0, always
    qualifies)."""
    out = list(assignment)
    for t, c in enumerate(out):
        if qualifies(options[t][c], epsilon):
            continue
        denser = [d for d, o in enumerate(options[t]) if qualifies(o, epsilon) and o.nbytes >= options[t][c].nbytes]
        out[t] = min(denser, key=lambda d: (options[t][d].nbytes, d)) if denser else 0
    return out


def optimum(options, link, compute, overlap, epsilon, start, order, passes=8):
    """Coordinate descent from `start` over the qualifying candidates, tensors in `order`; see the module
    docstring. Returns the assignment."""
    assignment = guarded(options, start, epsilon)
    model = Prediction(options, assignment, link, compute, overlap)
    for _ in range(passes):
        changed = False
        for t in order:
            old = assignment[t]
            best, best_step = old, model.step()
            for c, option in enumerate(options[t]):
                if c == old or not qualifies(option, epsilon):
                    continue
                step = model.moved(t, old, c)
                if step < best_step * (1 - 1e-9) or (c < best and step <= best_step * (1 + 1e-9)):
                    best, best_step = c, step
            if best != old:
                model.move(t, old, best)
                assignment[t] = best
                changed = True
        if not changed:
            break
    return assignment


def decide(options, link, compute, overlap, epsilon, current, sizes, names, margin):
    """The next assignment: the optimum where it is predicted at least `margin` faster than the current assignment
    (each guard-failing tensor moved denser), else that guarded current one. Returns (assignment, predicted step of
    it, predicted step of the current one)."""
    order = sorted(range(len(options)), key=lambda t: (-sizes[t], names[t]))
    held = guarded(options, current, epsilon)
    held_step = predicted_step(options, held, link, compute, overlap)
    best, best_step = held, held_step
    ncandidates = max(len(row) for row in options)
    # from the current choice, and from each candidate on every tensor (the latency terms make local optima)
    for start in [held] + [[c if c < len(row) else 0 for row in options] for c in range(ncandidates)]:
        found = optimum(options, link, compute, overlap, epsilon, start, order)
        step = predicted_step(options, found, link, compute, overlap)
        if step < best_step * (1 - 1e-9):
            best, best_step = found, step
    if best_step <= held_step * (1 - margin):
        return best, best_step, held_step
    return held, held_step, held_step


def uniform_assignments(options, epsilon):
    """Per candidate c, the assignment of c to every tensor (guarded: where c is not allowed or lost its guard, the
    nearest denser candidate); without repeats, in candidate order."""
    out = []
    for c in range(max(len(row) for row in options)):
        plan = guarded(options, [c if c < len(row) else 0 for row in options], epsilon)
        if plan not in out:
            out.append(plan)
    return out


def best_uniforms(options, link, compute, overlap, epsilon, count):
    """The `count` uniform assignments with the least predicted steps, least first (ties: the earlier candidate)."""
    plans = uniform_assignments(options, epsilon)
    steps = [predicted_step(options, p, link, compute, overlap) for p in plans]
    return [plans[i] for i in sorted(range(len(plans)), key=lambda i: (steps[i], i))[:count]]


def timing_noise(measured):
    """The timed windows' relative spread: their coefficient of variation pooled over the assignments timed in two
    windows or more (`measured`: tuple -> seconds per timed window); None where none is."""
    squares, degrees = 0.0, 0
    for samples in measured.values():
        if len(samples) >= 2:
            mean = statistics.fmean(samples)
            squares += sum((s / mean - 1.0) ** 2 for s in samples)
            degrees += len(samples) - 1
    return math.sqrt(squares / degrees) if degrees else None


def beyond_noise(faster, slower, noise):
    """Whether the timed windows `faster` average below `slower` by NOISE_Z standard errors of the difference of
    the two means, a window's relative spread being `noise`:

        mean(slower) - mean(faster) >= NOISE_Z * noise * sqrt(mean(faster)^2 / n_faster + mean(slower)^2 / n_slower)

    True where either was not timed or no spread is known yet (the margin alone decides)."""
    if not faster or not slower or noise is None:
        return True
    fast, slow = statistics.fmean(faster), statistics.fmean(slower)
    return slow - fast >= NOISE_Z * noise * math.sqrt(fast * fast / len(faster) + slow * slow / len(slower))


def measured_choice(plans, current, measured, predicted, scale, margin):
    """The next assignment among `plans` (each qualifying; `current` among them): the one with the least estimate
    among those whose estimate is at least `margin` lower than `current`'s and, where both were timed, lower beyond
    the timings' noise (``beyond_noise``); else `current`. A measured assignment's estimate (`measured`: tuple ->
    seconds per timed window) is its mean timed step, any other's predicted(plan) * scale (ties: the earlier in
    `plans`). On a shared host a window's median step moves from window to window by as much as methods differ
    (benchmarks/RESULTS.md, section "Compression.auto, the step grid at 2 ranks, third run"): two assignments that
    close are not told apart by a window or two, and each move costs (a residual moved or carried)."""
    def estimate(plan):
        key = tuple(plan)
        return statistics.fmean(measured[key]) if key in measured else predicted(plan) * scale

    held, noise = estimate(current), timing_noise(measured)
    better = [i for i, plan in enumerate(plans) if estimate(plan) <= held * (1 - margin)
              and beyond_noise(measured.get(tuple(plan)), measured.get(tuple(current)), noise)]
    if not better:
        return list(current)
    return list(plans[min(better, key=lambda i: (estimate(plans[i]), i))])


def decide_measured(options, link, compute, overlap, epsilon, current, sizes, names, margin, measured, explore,
                    trials=TRIALS):
    """The next assignment (module docstring): the model's (``decide``) until the current assignment has a measured
    step (`measured`: tuple -> seconds per timed window); then, while `explore`, the first of the `trials` best
    uniform assignments (by prediction) that differs from the current one (guarded) and was not measured; else
    ``measured_choice`` among the current one (guarded), the model's proposal and every measured assignment that
    qualifies, an assignment not measured scaled by the largest mean measured / predicted."""
    proposal, _, _ = decide(options, link, compute, overlap, epsilon, current, sizes, names, margin)
    if tuple(current) not in measured:
        return proposal

    def predicted(plan):
        return predicted_step(options, plan, link, compute, overlap)

    held = guarded(options, current, epsilon)
    if explore:
        for uniform in best_uniforms(options, link, compute, overlap, epsilon, trials):
            if uniform != held and tuple(uniform) not in measured:
                return uniform
    plans = [held]
    for plan in [proposal] + [list(p) for p in measured]:
        if plan not in plans and guarded(options, plan, epsilon) == plan:
            plans.append(plan)
    scale = max(statistics.fmean(seconds) / max(predicted(list(plan)), 1e-12) for plan, seconds in measured.items())
    return measured_choice(plans, held, measured, predicted, scale, margin)


def confirmed(chosen, held, proposed):
    """A switch taken on timings stands only when the same assignment is chosen at two window ends in a row, so
    that one noisy window does not move the choice (a move off an error-feedback candidate sends its residual at
    once: each needless move costs accuracy too). `held`: the current assignment (guarded); `proposed`: the
    switch chosen at the last window's end, or None. Returns (the assignment in force next, the switch waiting)."""
    if chosen == held:
        return held, None
    if chosen == proposed:
        return chosen, None
    return held, chosen
