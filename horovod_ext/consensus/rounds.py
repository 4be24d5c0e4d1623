"""The schedule of a parameter-space optimizer's communication rounds, synchronous or asynchronous (framework-free).

A *round* starts at a step where a pull is due (every `period` steps). Synchronously (max_staleness = 0) it is
finished within that step: the loss exchange, the election, the leader's broadcast (LSGD) or the allreduce
(EASGD), and the pull, all before the local optimizer step.

Asynchronously, with staleness bound D = max_staleness >= 1, the round's collectives are started by handle
(Horovod's ``*_async``) and run on Horovod's background thread while the rank keeps taking local steps:

    step s        (LSGD) start the allgather of the loss windows            (EASGD) start the allreduce of x_s
    step s + 1    (LSGD) wait for it (16 bytes, started a step ago), elect, start the leader's broadcast of x_L
    step a        apply the pull, waiting only for what has not arrived:    a = s + lag + D,
                  lag = 1 for LSGD (its election), 0 for EASGD

so the leader's parameters (or the workers' mean) are exactly D steps old when applied, on every rank: the
schedule depends on the step count only, never on when a transfer happens to finish, so every rank applies the
same rounds at the same steps and a run is reproducible on any link. A transfer that has not completed by step a
is waited for there: the staleness is bounded, and the algorithm stays defined however slow the link.

Within one step the order is: start the round due now, elect the rounds whose election is due (their broadcast
sends the parameters as they are at the start of this step), then apply the rounds whose pull is due, then the
local optimizer step. With D = 0 this is the synchronous optimizer, bit for bit.
"""


def check_staleness(asynchronous, max_staleness, period):
    """The staleness bound D of one optimizer: 0 when synchronous; max_staleness when given; else period - 1
    (at least 1), the largest D that keeps one round in flight. Raises ValueError naming the argument."""
    if not isinstance(asynchronous, bool):
        raise ValueError(f"asynchronous must be True or False, got {asynchronous!r}")
    if max_staleness is not None and (isinstance(max_staleness, bool) or not isinstance(max_staleness, int)
                                      or max_staleness < 0):
        raise ValueError(f"max_staleness must be None (period - 1) or an integer >= 0 (steps a pull may lag "
                         f"its transfer's start; 0 is synchronous), got {max_staleness!r}")
    if not asynchronous:
        if max_staleness not in (None, 0):
            raise ValueError(f"max_staleness={max_staleness} needs asynchronous=True (a synchronous optimizer "
                             f"applies every pull at the step its round starts)")
        return 0
    return max(1, period - 1) if max_staleness is None else max_staleness


class Round:
    """One round: started at `step` for the levels of the due mask `due` (bit i: level i; EASGD: 1, the center).

    exchange: the loss exchange (a framework future, then the gathered windows); transfers: what is in flight
    (futures by level name, then values); leaders: each level's leader (asynchronous rounds, for checkpoints);
    pulls: the mask of the due levels whose leader is another rank. consensus/step.py fills them in."""

    def __init__(self, step, due, elect_at, apply_at, slot):
        self.step, self.due, self.elect_at, self.apply_at, self.slot = step, due, elect_at, apply_at, slot
        self.exchange = None
        self.transfers = None
        self.leaders = None
        self.pulls = None

    def __repr__(self):
        return f"Round(step={self.step}, elect_at={self.elect_at}, apply_at={self.apply_at})"


class Rounds:
    """The rounds in flight, in the order they started.

    lag: steps between a round's start and its election (1 for asynchronous LSGD, else 0). Collective names use
    a slot that cycles over as many rounds as can be in flight at once, so that no name is in flight twice."""

    def __init__(self, staleness, period, lag):
        self.staleness, self.period = staleness, period
        self.lag = lag if staleness else 0
        self.slots = (self.lag + staleness) // period + 2
        self.pending = []

    @property
    def asynchronous(self):
        return self.staleness > 0

    def start(self, step, due):
        r = Round(step, due, step + self.lag, step + self.lag + self.staleness, (step // self.period) % self.slots)
        self.pending.append(r)
        return r

    def electing(self, step):
        return [r for r in self.pending if r.elect_at == step]

    def applying(self, step):
        """The rounds whose pull is due at `step`, removed from the pending list."""
        due = [r for r in self.pending if r.apply_at == step]
        self.pending = [r for r in self.pending if r.apply_at != step]
        return due

    def clear(self):
        self.pending = []
