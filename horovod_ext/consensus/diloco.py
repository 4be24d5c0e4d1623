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

A worker is one rank (``groups=None``) or a group of ranks (``groups="node"``: the ranks of a host; or explicit
rank lists), a Horovod process set whose members average their gradients at every inner step (an allreduce over
the group, through ``inner_compression``'s plan) and so hold the same parameters. At a round only the group's
first rank (its leader) sends: the leaders average their pseudo-gradients across groups, and each leader then
broadcasts the average inside its group, where every member takes the same outer step (DiLoCo's hierarchical
setting, the multi-leader LSGD's layout: groups within a node, the outer exchange across nodes).

The exchange is a step of the compression plan over the pseudo-gradients (a StepDriver of the run, with the
round as its step counter): no second codec path. What a round sends is counted by the plan's context like a
gradient step's; the dense reference of the inner steps between rounds is data-parallel SGD's allreduce.
"""
import numbers

from .agreement import process_set_for
from .groups import check_groups, describe_groups, group_of, resolve_groups

DEFAULTS = {"inner_steps": 50, "outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True, "groups": None}
NO_COMPRESSION = "NoneCompressor"  # describe_compression(Compression.none), in both frameworks
GROUPS_HELP = ('groups must be None (every rank is a worker), "node" (the ranks of a host are one '
               'worker) or a list of rank lists such as [[0, 1], [2, 3]]')


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
    """The outer loop's settings (check_arguments') and the workers, agreed across ranks at construction
    (consensus/agreement.py's build_on_every_rank, which calls configure() with every rank's host and sets
    ``generation``). After configure(): ``workers`` (the partition of the ranks into workers), ``group`` (this
    rank's worker), ``leaders`` (each worker's first rank, the one that sends at a round), ``is_leader``."""

    def __init__(self, size=None, groups=None, inner_compressed=False, **arguments):
        checked = check_arguments(**arguments)
        self.inner_steps, self.outer_lr = checked["inner_steps"], checked["outer_lr"]
        self.outer_momentum, self.nesterov = checked["outer_momentum"], checked["nesterov"]
        if groups is not None and size is None:
            raise TypeError("DiLoCoSettings: groups need the job's size")
        self.groups_arg = check_groups(groups, size, GROUPS_HELP) if groups is not None else None
        if inner_compressed and groups is None:
            raise ValueError("inner_compression compresses the gradients that a worker's ranks average at every "
                             "inner step; with groups=None every rank is a worker of its own and averages nothing: "
                             'pass groups ("node" or rank lists) or leave inner_compression at Compression.none')
        self.workers = self.group = self.leaders = None
        self.is_leader = True
        self.generation = 0

    def configure(self, node_keys, rank):
        """The workers, from every rank's host (node_keys[r]: rank r's, for groups="node")."""
        size = len(node_keys)
        self.workers = [[r] for r in range(size)] if self.groups_arg is None \
            else resolve_groups(self.groups_arg, node_keys)
        self.group = group_of(self.workers, rank)
        self.leaders = [g[0] for g in self.workers]
        self.is_leader = rank == self.group[0]

    def describe(self):
        return {"inner_steps": self.inner_steps, "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum,
                "nesterov": self.nesterov, "groups": describe_groups(self.groups_arg)}


def worker_process_sets(settings, size, add_process_set, barrier):
    """(this rank's worker's process set, None if the worker is one rank; the leaders' process set). Every rank
    adds every group's set and then the leaders', in the same order (Horovod's add_process_set is collective)."""
    own = None
    for group in settings.workers:
        if len(group) > 1:
            made = process_set_for(group, size, add_process_set, barrier)
            if group == settings.group:
                own = made
    return own, process_set_for(settings.leaders, size, add_process_set, barrier)


def averaged_pseudo_gradient(settings, deltas, across_leaders, in_group):
    """Delta, the workers' average: across_leaders(deltas) on a leader (the exchange through the plan, over the
    leaders' process set), then in_group(values) (the leader's broadcast to its group) where the worker has more
    than one rank; a member that is not a leader passes its own deltas, which the broadcast replaces."""
    delta = across_leaders(deltas) if settings.is_leader else deltas
    return in_group(delta) if len(settings.group) > 1 else delta


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
