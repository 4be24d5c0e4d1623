"""DiLoCo's outer step, framework-free: every worker takes `inner_steps` steps of its own optimizer, then the
workers average their pseudo-gradients through the compression plan and an outer SGD step with Nesterov momentum
moves the outer parameters, from which every worker continues.

DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models", arXiv 2311.08105,
2023); the definition and the test oracle is python/hvdext_reference/diloco.py. Per round, with theta the outer
parameters (the same on every rank), theta_m this rank's after its inner steps and b the outer momentum:

    Delta_m = theta - theta_m                     the pseudo-gradient (outer minus local)
    Delta   = mean_m C(Delta_m (+ e_m))            the compression plan's average (driver.py): any compressor,
                                                   error feedback e_m by its codec's wrapper (feedback.py)
    b       = Delta (first round), else mu * b + Delta
    theta   = theta - eta * (Delta + mu * b)       (nesterov=False: theta - eta * b)
    theta_m = theta

Each operation is one float32 rounding, in the order written (the frameworks' tensor operators with Python
float scalars compute exactly that), so every rank's bits equal the reference's.

The exchange is a step of the compression plan over the pseudo-gradients (a StepDriver of the run, with the
round as its step counter): no second codec path. What a round sends is counted by the plan's context like a
gradient step's; the dense reference of the inner steps between rounds is data-parallel SGD's allreduce.
"""
import numbers

DEFAULTS = {"inner_steps": 50, "outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}


def check_arguments(inner_steps=50, outer_lr=0.7, outer_momentum=0.9, nesterov=True):
    """The outer loop's settings, checked (ValueError naming the argument and what it may be)."""
    if isinstance(inner_steps, bool) or not isinstance(inner_steps, numbers.Integral) or inner_steps < 1:
        raise ValueError(f"DiLoCoOptimizer: inner_steps must be an integer >= 1, got {inner_steps!r}")
    if isinstance(outer_lr, bool) or not isinstance(outer_lr, numbers.Real) or not outer_lr > 0:
        raise ValueError(f"DiLoCoOptimizer: outer_lr must be a number > 0, got {outer_lr!r}")
    if isinstance(outer_momentum, bool) or not isinstance(outer_momentum, numbers.Real) \
            or not 0 <= outer_momentum < 1:
        raise ValueError(f"DiLoCoOptimizer: outer_momentum must be a number in [0, 1), got {outer_momentum!r}")
    if not isinstance(nesterov, bool):
        raise ValueError(f"DiLoCoOptimizer: nesterov must be True or False, got {nesterov!r}")
    return {"inner_steps": int(inner_steps), "outer_lr": float(outer_lr), "outer_momentum": float(outer_momentum),
            "nesterov": nesterov}


class DiLoCoSettings:
    """The outer loop's settings (check_arguments'), agreed across ranks at construction
    (consensus/agreement.py's build_on_every_rank, which sets ``generation``)."""

    def __init__(self, **arguments):
        checked = check_arguments(**arguments)
        self.inner_steps, self.outer_lr = checked["inner_steps"], checked["outer_lr"]
        self.outer_momentum, self.nesterov = checked["outer_momentum"], checked["nesterov"]
        self.generation = 0

    def describe(self):
        return {"inner_steps": self.inner_steps, "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum,
                "nesterov": self.nesterov}


def outer_update(outer, momentum, delta, outer_lr, outer_momentum, nesterov):
    """(theta, b) after one outer SGD step on the averaged pseudo-gradient, per tensor; momentum None: the first
    round (b = Delta). Framework tensors with their own operators."""
    new_outer, new_momentum = [], []
    for theta, b, d in zip(outer, momentum if momentum is not None else [None] * len(outer), delta):
        b = d if b is None else (b * outer_momentum) + d
        step = d + (b * outer_momentum) if nesterov else b
        new_outer.append(theta - (step * outer_lr))
        new_momentum.append(b)
    return new_outer, new_momentum


def exchange(driver, names, deltas, round_, seed, result_of):
    """The average of the ranks' pseudo-gradients through the compression plan: one step of `driver` (round_ is
    its step counter, the draws' key) over the tensors `deltas` (float32, named `names`). result_of(item): the
    averaged tensor the backend wrote for an item."""
    driver.begin(round_, seed)
    items = [driver.item(i, name, d, _numel(d), 4) for i, (name, d) in enumerate(zip(names, deltas))]
    for item in items:
        driver.launch(item)
    driver.finish(items, round_)
    return [result_of(item) for item in items]


def _numel(x):
    shape = getattr(x, "shape", ())
    n = 1
    for dim in shape:
        n *= int(dim)
    return n
