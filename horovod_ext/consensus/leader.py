"""LSGD's bookkeeping, shared by the PyTorch and TensorFlow adapters (framework-free, scalars only).

LSGD (Teng et al., NeurIPS 2019; the math is python/hvdext_reference/lsgd.py): every worker steps on its own
gradient; at pull steps it is also pulled toward leaders, the workers with the lowest running-average training loss:

    x <- x - lr * g - pull * (x - x_group_leader) - global_pull * (x - x_global_leader)

A *level* is one of those forces: a set of member ranks (a Horovod process set), a period and a weight.
Single-leader LSGD (groups=None) has one level: all ranks, every `period` steps, weight `pull`. Multi-leader LSGD
has two: the rank's group every `period` steps (`pull`) and all ranks every `global_period` steps (`global_pull`).

At a step where any level is due, every rank contributes (sum, count) of the losses reported since the last
election to one small allgather; every rank then elects the same leaders from the same numbers (lowest average,
ties to the lowest rank), so no second round is needed to agree. A missing or non-finite loss raises on every rank.
Levels with the same members (groups="node" on one host: the group is every rank) elect the same leader, and one
broadcast serves both (see transfer_levels).

Asynchronous LSGD (asynchronous=True, staleness bound D; the schedule is rounds.py): the leader's parameters are
sent at step s + 1 and applied at step a = s + 1 + D, with the force taken at the step it is applied:

    x_a <- x_a - lr * g_a - pull * (x_a - x_L[s+1]) - global_pull * (x_a - x_G[s+1])

A worker that is itself a round's leader takes no pull from that round (its own parameters are the freshest copy
of the leader's). The paper's own implementation is asynchronous through parameter servers (a worker asks its
local server, which asks the global one: Teng et al. 2019, Fig. 8), so a worker's pull uses the leader's
parameters as that server last received them, some local steps old. Here the staleness is fixed to D instead of
left to timing: every rank applies the same schedule, and the run is reproducible.
"""
import math

from horovod_ext.compression.wire import allgather_wire_bytes, broadcast_wire_bytes
from .groups import GROUPS_HELP, check_groups, group_of, resolve_groups
from .rounds import check_staleness

LOSS_HELP = "pass a closure to optimizer.step(closure) or call optimizer.report_loss(loss) before optimizer.step()"


def check_evaluation(which, allowed, what):
    """The `which` argument of evaluation_parameters(): one of `allowed` ({name: what it evaluates})."""
    if which not in allowed:
        choices = "; ".join(f"{name!r}: {meaning}" for name, meaning in allowed.items())
        raise ValueError(f"{what}.evaluation_parameters: which must be one of {list(allowed)} ({choices}), "
                         f"got {which!r}")
    return which


LEADER_EVALUATION = {"leader": "the best worker of the last election (one broadcast)",
                     "center": "the workers' average, the paper's center variable (one allreduce)"}
ELASTIC_EVALUATION = {"center": "EASGD's center variable, held by every rank (no communication)"}


def _check_weight(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1) (0 turns that pull off; LSGD's default is 0.1), "
                         f"got {value!r}")
    return float(value)


def _check_period(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 (steps between pulls), got {value!r}")
    return value


class Level:
    """One pulling force: toward the leader of `members`, every `period` steps, with weight `weight`."""

    def __init__(self, name, members, period, weight):
        self.name, self.members, self.period, self.weight = name, list(members), period, weight

    def __repr__(self):
        return f"Level({self.name}, members={self.members}, period={self.period}, weight={self.weight})"


class LeaderSync:
    """Arguments, groups, schedule, election and state of one LeaderOptimizer."""

    what = "LeaderOptimizer"
    generation = 0  # the reset generation of its collectives' names, set when built (agreement.py)

    def __init__(self, pull=0.1, global_pull=0.1, period=4, global_period=16, groups="node", asynchronous=False,
                 max_staleness=None, size=1):
        self.pull = _check_weight("pull", pull)
        self.global_pull = _check_weight("global_pull", global_pull)
        self.period = _check_period("period", period)
        self.global_period = _check_period("global_period", global_period)
        if groups is not None and self.global_period % self.period:
            raise ValueError(f"global_period must be a multiple of period (LSGD's default is 4 * period); "
                             f"got period={period}, global_period={global_period}")
        if groups is not None and self.pull + self.global_pull >= 1.0:
            raise ValueError(f"pull + global_pull must be < 1 (the update is a convex combination of the worker "
                             f"and its leaders); got pull={pull}, global_pull={global_pull}")
        self.groups_arg = check_groups(groups, size)
        self.staleness = check_staleness(asynchronous, max_staleness, self.period)
        self.size = size
        self.groups = None
        self.levels = []
        self.best_rank = 0          # the global leader of the last election (rank 0 before the first)
        self.leaders = {}           # level name -> leader rank of the last election of that level
        self.last_election = 0      # the step of the last election
        self.elected = False        # whether this sync has elected (elect: the first election after a reset)

    @staticmethod
    def arguments(pull, global_pull, period, global_period, groups, asynchronous, max_staleness):
        """LeaderOptimizer's arguments by name, as both frameworks' factories take them (compared across ranks at
        construction, then passed to LeaderSync)."""
        return {"pull": pull, "global_pull": global_pull, "period": period, "global_period": global_period,
                "groups": groups, "asynchronous": asynchronous, "max_staleness": max_staleness}

    def configure(self, node_keys, rank):
        """Resolve the groups from every rank's host and build this rank's levels."""
        self.groups = resolve_groups(self.groups_arg, node_keys)
        everyone = list(range(len(node_keys)))
        if self.groups_arg is None:
            self.levels = [Level("leader", everyone, self.period, self.pull)]
        else:
            self.levels = [Level("group", group_of(self.groups, rank), self.period, self.pull),
                           Level("global", everyone, self.global_period, self.global_pull)]
        return self.groups

    def due(self, step):
        """The levels whose pull falls on `step` (counted from 1: every `period`-th step), as a mask: bit i for
        self.levels[i] (0: no round starts)."""
        return sum(1 << i for i, level in enumerate(self.levels) if step % level.period == 0)

    def levels_in(self, mask):
        """The levels of a due mask, in order."""
        return [level for i, level in enumerate(self.levels) if int(mask) >> i & 1]

    def mask_of(self, names):
        """The due mask of the levels named (a checkpoint's round)."""
        return sum(1 << i for i, level in enumerate(self.levels) if level.name in names)

    def elect(self, windows, step):
        """windows[r] = (loss sum, loss count) of rank r since the last election. Returns {level name: leader}
        for every level and records the global best. Raises on every rank (the same numbers everywhere).

        A rank that reported no loss is an error, except at the first election after an elastic reset
        (generation > 0, the same on every rank): a rank the reset added has had no step yet where a Keras
        callback reports after the batch, and a survivor's window may be a commit's empty one. Such a rank is not
        elected there; where no member of a level reported, its lowest rank leads (the reset synchronized every
        rank from rank 0)."""
        first = self.last_election + 1
        missing = [r for r, (_, count) in enumerate(windows) if count == 0]
        after_reset = self.generation > 0 and not self.elected
        if missing and not after_reset:
            raise ValueError(f"{self.what}: no training loss reported on rank(s) {missing} during steps "
                             f"{first}..{step}; {LOSS_HELP}")
        means = [total / count if count else math.inf for total, count in windows]
        bad = [r for r, m in enumerate(means) if r not in missing and not math.isfinite(m)]
        if bad:
            raise FloatingPointError(f"{self.what}: NaN or Inf training loss reported on rank(s) {bad} during "
                                     f"steps {first}..{step}; the loss must be finite (lower the learning rate, "
                                     f"or clip gradients)")
        best = lambda members: min(members, key=lambda r: (means[r], r))  # noqa: E731
        self.leaders = {level.name: best(level.members) for level in self.levels}
        self.best_rank = best(range(len(windows)))
        self.last_election = step
        self.elected = True
        return self.leaders

    def transfer_levels(self, levels):
        """{level name: the level whose broadcast delivers its leader's parameters} for those of `levels` that
        pull (weight > 0, more than one member). A level with the same members as an earlier one that is due
        whenever it is (its period divides this one's) elected the same leader: it reuses that broadcast."""
        pulling = [level for level in levels if level.weight > 0 and len(level.members) > 1]
        source = {}
        for level in pulling:
            source[level.name] = next((earlier for earlier in pulling if earlier.members == level.members
                                       and level.period % earlier.period == 0), level)
        return source

    def account(self, stats, due, param_bytes, nranks):
        """Bytes of the round of a due mask: the election's allgather and one broadcast of the parameters per
        distinct transfer."""
        if not due:
            return
        stats.add(payload_bytes=16, wire_bytes=allgather_wire_bytes(16, nranks))
        for name, source in self.transfer_levels(self.levels_in(due)).items():
            if source.name == name:
                stats.add(payload_bytes=param_bytes, wire_bytes=broadcast_wire_bytes(param_bytes, len(source.members)))

    def state(self):
        return {"best_rank": self.best_rank, "leaders": dict(self.leaders), "last_election": self.last_election}

    def load_state(self, state):
        self.best_rank = int(state["best_rank"])
        self.leaders = {k: int(v) for k, v in state["leaders"].items()}
        self.last_election = int(state["last_election"])


__all__ = ["LeaderSync", "Level", "GROUPS_HELP", "LOSS_HELP", "LEADER_EVALUATION", "ELASTIC_EVALUATION",
           "check_evaluation"]
