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
gradient step's; the dense reference of the inner steps between rounds is data-parallel SGD's allreduce; every other
collective (the start's broadcast, the election, the in-group averages and broadcasts) by diloco_accounting.py.
"""
import math
import numbers

from .agreement import process_set_for
from .groups import check_groups, describe_groups, group_of, resolve_groups
from .leader import LOSS_HELP

DEFAULTS = {"inner_steps": 50, "outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True, "groups": None,
            "fragments": 1, "overlap": 0, "merge_alpha": 0.0, "outer": "average"}
OUTERS = ("average", "leader")
NO_COMPRESSION = "NoneCompressor"  # describe_compression(Compression.none), in both frameworks
GROUPS_HELP = ('groups must be None (every rank is a worker), "node" (the ranks of a host are one '
               'worker) or a list of rank lists such as [[0, 1], [2, 3]]')


def check_arguments(inner_steps=50, outer_lr=0.7, outer_momentum=0.9, nesterov=True, fragments=1, overlap=0,
                    merge_alpha=0.0, outer="average"):
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
    if isinstance(fragments, bool) or not isinstance(fragments, numbers.Integral) or fragments < 1 \
            or inner_steps % fragments:
        raise ValueError(f"DiLoCoOptimizer: fragments must be an integer >= 1 that divides inner_steps "
                         f"({inner_steps}): one fragment is synchronized every inner_steps / fragments steps; "
                         f"got {fragments!r}")
    window = inner_steps // fragments
    if isinstance(overlap, bool) or not isinstance(overlap, numbers.Integral) or not 0 <= overlap < window:
        raise ValueError(f"DiLoCoOptimizer: overlap must be an integer in [0, inner_steps / fragments) = "
                         f"[0, {window}): a fragment's exchange must end before the next one starts; "
                         f"got {overlap!r}")
    if isinstance(merge_alpha, bool) or not isinstance(merge_alpha, numbers.Real) or not 0 <= merge_alpha <= 1:
        raise ValueError(f"DiLoCoOptimizer: merge_alpha must be a number in [0, 1], got {merge_alpha!r}")
    if not isinstance(outer, str) or outer not in OUTERS:
        raise ValueError(f"DiLoCoOptimizer: outer must be one of {', '.join(repr(o) for o in OUTERS)} (the workers' "
                         f"average, or the pseudo-gradient of the worker with the lowest training loss); got {outer!r}")
    return {"outer": outer, "inner_steps": int(inner_steps), "outer_lr": float(outer_lr),
            "outer_momentum": float(outer_momentum),
            "nesterov": nesterov, "fragments": int(fragments), "overlap": int(overlap),
            "merge_alpha": float(merge_alpha)}


def layer_of(name):
    """A tensor's layer: its name without the last component ("blocks.0.attn.weight" -> "blocks.0.attn";
    Keras's "dense_1/kernel" -> "dense_1"; a bare module's "weight" -> "", the module itself)."""
    cut = max(name.rfind("."), name.rfind("/"))
    return name[:cut] if cut > 0 else ""


def fragments_of(names, fragments):
    """Streaming DiLoCo's fragments (Douillard et al., "Streaming DiLoCo with overlapping communication", arXiv
    2501.18512, 2025): the tensors' indices per fragment. Whole layers (layer_of), in the order they first appear,
    assigned strided: layer j belongs to fragment j mod P, so that every fragment holds layers from the whole depth
    of the model (the paper's strided pattern). Raises ValueError if there are fewer layers than fragments."""
    layers = []
    for name in names:
        if layer_of(name) not in layers:
            layers.append(layer_of(name))
    if fragments > len(layers):
        shown = ", ".join(repr(layer) for layer in layers[:8]) + (", ..." if len(layers) > 8 else "")
        raise ValueError(f"DiLoCoOptimizer: fragments={fragments} is more than the model's {len(layers)} layer(s) "
                         f"({shown}); a fragment is made of "
                         f"whole layers: fragments must be at most {len(layers)}")
    return [[i for i, name in enumerate(names) if layers.index(layer_of(name)) % fragments == p]
            for p in range(fragments)]


class Schedule:
    """When fragments are exchanged and applied (Streaming DiLoCo). With H = inner_steps, P = fragments, the window
    w = H / P and tau = overlap: after inner step t (counted from 1) with t % w == 0, fragment ((t / w) - 1) mod P
    starts its exchange, from the worker's parameters at t; its outer update is applied after inner step t + tau,
    where the worker's fragment becomes merge_alpha * theta_m + (1 - merge_alpha) * theta (merged). Each fragment is
    so synchronized every H steps, fragment p first after (p + 1) w steps; P = 1, tau = 0 is DiLoCo."""

    def __init__(self, inner_steps, fragments, overlap):
        self.window, self.fragments, self.overlap = inner_steps // fragments, fragments, overlap

    def at(self, step):
        """(whether a fragment's exchange starts after inner step `step`, which fragment if it does), in operators
        that Python integers and framework tensors (TensorFlow's, inside a graph) share."""
        return (step > 0) & (step % self.window == 0), (step // self.window - 1) % self.fragments

    def starts(self, step):
        """The fragment whose exchange starts after inner step `step`, or None."""
        truth, fragment = self.at(step)
        return fragment if truth else None

    def applies(self, step):
        """The fragment whose outer update is applied after inner step `step`, or None."""
        return self.starts(step - self.overlap)


def merged(local, outer, merge_alpha):
    """The worker's fragment after its outer update: alpha * theta_m + (1 - alpha) * theta, each product rounded to
    float32 before the add (Streaming DiLoCo's mixing; alpha = 0: theta itself, so the replicas stay identical)."""
    if merge_alpha == 0:
        return outer
    return (local * merge_alpha) + (outer * (1.0 - merge_alpha))


class DiLoCoSettings:
    """The outer loop's settings (check_arguments') and the workers, agreed across ranks at construction
    (consensus/agreement.py's build_on_every_rank, which calls configure() with every rank's host and sets
    ``generation``). After configure(): ``workers`` (the partition of the ranks into workers), ``group`` (this
    rank's worker), ``leaders`` (each worker's first rank, the one that sends at a round), ``is_leader``."""

    def __init__(self, size=None, groups=None, inner_compressed=False, compression=None, **arguments):
        checked = check_arguments(**arguments)
        if checked["outer"] == "leader":
            check_leader_compression(compression)
        self.inner_steps, self.outer_lr = checked["inner_steps"], checked["outer_lr"]
        self.outer_momentum, self.nesterov = checked["outer_momentum"], checked["nesterov"]
        self.fragments, self.overlap, self.merge_alpha = checked["fragments"], checked["overlap"], \
            checked["merge_alpha"]
        self.outer = checked["outer"]
        self.schedule = Schedule(self.inner_steps, self.fragments, self.overlap)
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
                "nesterov": self.nesterov, "groups": describe_groups(self.groups_arg), "fragments": self.fragments,
                "overlap": self.overlap, "merge_alpha": self.merge_alpha, "outer": self.outer}


def check_leader_compression(compression):
    """outer="leader" sends one worker's pseudo-gradient, which that worker encodes alone: a compressor whose
    encoding needs every rank (CompressorSpec.encodes_alone False: PowerSGD, GraVAC) cannot carry it."""
    if getattr(compression, "payload", False) and not getattr(compression, "encodes_alone", True):
        raise ValueError(f"DiLoCoOptimizer: outer='leader' sends the best worker's pseudo-gradient as that worker "
                         f"alone encodes it: compression must be none, fp16 (or a Horovod Compressor), ternary or "
                         f"topk; Compression.{compression.name} encodes with every rank (got {compression!r})")


def leader_transport(method, joined=False):
    """How outer="leader" sends a tensor with the plan's method: ("codec", the method's per-tensor codec, with
    its error feedback) for a payload compressor, ("linear", the Horovod Compressor) for Horovod's own (none,
    fp16): the elected worker's leader encodes, an allgather in which only its contribution is non-empty carries
    the payload (only its bytes travel), and every rank decodes it (codec.sent / Compressor.decompress). While a
    rank has joined (Horovod cannot allgather then): ("dense", None), the elected leader's float32 values summed
    with every other leader's zeros."""
    if joined:
        return "dense", None
    codec = getattr(method, "codec", None)
    if codec is not None and getattr(method.spec, "payload", False):
        return "codec", codec
    return "linear", method.spec


def election_row(loss, size, rank):
    """This rank's part of outer="leader"'s election, one allreduce (Sum) of a size x 3 table: zeros but for its
    row, (loss sum, loss count, 1). A rank that has called hvd.join() adds zeros (Horovod's join), so the sum's
    third column counts the ranks still training."""
    table = [[0.0, 0.0, 0.0] for _ in range(size)]
    table[rank] = [float(loss[0]), float(loss[1]), 1.0]
    return table


def elected(table, workers, what="DiLoCoOptimizer", lenient=False):
    """(the elected worker's index, whether some rank has joined) from the summed election table: a joined rank
    reported nothing and is not elected, and while one has, the exchange goes dense (as the plan's steps do)."""
    joined = sum(row[2] for row in table) < len(table)
    return elect_worker([row[:2] for row in table], workers, what, lenient=lenient or joined), joined


def elect_worker(windows, workers, what="DiLoCoOptimizer", lenient=False):
    """outer="leader": the index of the worker whose ranks reported the lowest mean training loss since the last
    election (windows[r] = (loss sum, count) of rank r, from one allgather: every rank elects the same worker; ties
    to the lowest index, as LSGD elects). A worker with no loss raises ValueError on every rank, unless `lenient`
    (the first election after an elastic reset, where an added rank has reported nothing: it is not elected); a
    NaN/Inf mean raises FloatingPointError."""
    means = []
    for group in workers:
        total, count = sum(windows[r][0] for r in group), sum(windows[r][1] for r in group)
        if not count and not lenient:
            raise ValueError(f"{what}: outer='leader' elects the worker with the lowest training loss, and rank(s) "
                             f"{group} reported none since the last exchange; {LOSS_HELP}")
        means.append(total / count if count else math.inf)
    bad = [g for g, m in zip(workers, means) if math.isnan(m) or (m == math.inf and any(windows[r][1] for r in g))]
    if bad:
        raise FloatingPointError(f"{what}: NaN or Inf training loss reported by rank(s) {sum(bad, [])}; the loss must "
                                 f"be finite (lower the learning rate, or clip gradients)")
    return min(range(len(workers)), key=lambda w: (means[w], w))


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
    return finish_exchange(driver, launch_exchange(driver, names, deltas, round_, seed), round_, result_of)


def launch_exchange(driver, names, deltas, round_, seed):
    """The exchange's first half: the step begins and every tensor is launched (asynchronous collectives where the
    backend's are). Returns the items for finish_exchange."""
    driver.begin(round_, seed)
    items = [driver.item(i, name, d, _numel(d), 4) for i, (name, d) in enumerate(zip(names, deltas))]
    for item in items:
        driver.launch(item)
    return items


def finish_exchange(driver, items, round_, result_of):
    """The exchange's second half: wait for what launch_exchange started; the averaged tensors, in order."""
    driver.finish(items, round_)
    return [result_of(item) for item in items]


def _numel(x):
    shape = getattr(x, "shape", ())
    n = 1
    for dim in shape:
        n *= int(dim)
    return n
