"""The whole step of LSGD, multi-leader LSGD and EASGD, written once over a ParameterBackend (backend.py): the
schedule, the byte accounting, the election, the pulls, EASGD's update, the rounds in flight, checkpoints of
what is in flight, and the evaluation swap. The adapters (horovod_ext/torch/leader.py,
horovod_ext/tensorflow/leader.py) supply the backend and Horovod's API around it; the bookkeeping (arguments,
groups, election rule) is leader.py's LeaderSync and elastic.py's ElasticSync.

A step, before the local optimizer's own:
 1. the step is counted, and on the host (schedule): the dense reference (what data-parallel SGD's allreduce of
    the gradients would send) and the bytes of the round that starts now are accounted, and the due mask taken
    (bit i: level i's pull falls on this step; EASGD has one level, the center);
 2. the rounds advance, each in three phases (rounds.py has the schedule):
    start  LSGD: every rank's loss window in one allgather; EASGD: the allreduce of the parameters;
    elect  LSGD: the leaders elected on the host (the same numbers on every rank: the same leaders), each due
           level's leader broadcast (one broadcast serves levels with the same members,
           LeaderSync.transfer_levels); EASGD: nothing;
    apply  LSGD: the pull, every force from the same x, over the due levels whose leader is another rank:
               x <- x + sum over those levels of w_level * (x_leader - x)
           EASGD: from the values before the round
               x <- x + alpha * (center - x),   center <- (1 - beta) * center + beta * mean,   alpha = beta / N.
    Synchronously (staleness 0) the round due now runs its three phases in this step, under one condition on the
    due mask, so that a tf.function builds it; asynchronously (eager only) the phases fall on the steps the
    schedule gives, with the collectives in flight between them. Both run the same phase code;
 3. the step's statistics end.
"""
import contextlib

from horovod_ext.in_flight import hold, release

from .accounting import account_dense_reference
from .rounds import Round, Rounds


def add_pull(forces, targets, current, weight):
    """forces + weight * (target - x), per parameter (forces None: the first term)."""
    terms = [(t - x) * weight for t, x in zip(targets, current)]
    return terms if forces is None else [f + term for f, term in zip(forces, terms)]


class ConsensusStep:
    """What LSGD's and EASGD's steps share: the schedule, the statistics, and the state every rank holds alike."""

    election_lag = 0  # asynchronous: steps between a round's start and its election (rounds.py)

    def __init__(self, sync, be, state, stats, tag, numel, param_bytes):
        self.sync, self.be, self.state, self.stats, self.tag = sync, be, state, stats, tag
        self.numel, self.param_bytes = numel, param_bytes
        self.rounds = Rounds(sync.staleness, sync.period, lag=self.election_lag)
        if self.rounds.asynchronous and not be.asynchronous:
            raise ValueError(f"{sync.what}: this backend has no asynchronous collectives; use asynchronous=False")

    def name(self, *parts):
        return ".".join([self.tag, *map(str, parts)])

    def step(self):
        """Run this step's communication (before the local optimizer step). Returns what a graph must run first."""
        be = self.be
        step = self.state.advance_step()
        with be.timed():
            due, = be.host(self.schedule, [step, *self.schedule_inputs()], ("int32",))
            if self.rounds.asynchronous:  # eager: Python values, collectives in flight across steps
                self.advance_rounds(int(step), int(due))
                (hold if self.rounds.pending else release)(self)  # completed at exit if still in flight
                done = None
            else:
                done = be.after(self.prepare(), lambda: be.when(due, lambda: self.whole_round(step, due)))
        return be.after(done, lambda: be.host(self.end_step, [], ("int32",)))

    def advance_rounds(self, step, due):
        """Asynchronously: start the round due now, elect the rounds whose election is due, apply the rounds whose
        pull is due (rounds.py)."""
        self.prepare()
        if due:
            self.start(self.rounds.start(step, due))
        for r in self.rounds.electing(step):
            self.elect(r)
        for r in self.rounds.applying(step):
            self.apply(r)

    def whole_round(self, step, due):
        """Synchronously: the round due now, its three phases in this step. Returns what a graph must run."""
        r = Round(step, due, step, step, 0)
        self.start(r)
        self.elect(r)
        return self.apply(r)

    def prepare(self):
        """What must hold before any round (EASGD: the center). Returns what a graph must run, or None."""
        return None

    def schedule_inputs(self):
        return []

    def schedule(self, step, *inputs):
        """On the host: account this step's bytes; return the due mask (0: no round starts)."""
        account_dense_reference(self.stats, self.numel, self.param_bytes, self.be.nranks)
        return self.account_rounds(int(step), *inputs)

    def end_step(self):
        self.stats.end_step()
        return 0

    # ------------------------------------------------------------------------------------------- observability
    def compression_stats(self):
        """Bytes this rank handed to collectives and bytes on the wire, against data-parallel SGD's allreduce of
        the gradients (dense_bytes, dense_wire_bytes), per step and in total; the schedule and the sync state."""
        self.state.shared_state_read(self)
        stats = self.stats.as_dict()
        stats.update(ranks=self.be.nranks, optimizer=self.sync.what, staleness=self.sync.staleness,
                     rounds_in_flight=len(self.rounds.pending), **self.sync.state())
        return stats

    def shared_state(self):
        return self.sync.state()

    def load_shared_state(self, state):
        self.sync.load_state(state)

    def forget_in_flight(self):
        """Drop the rounds in flight without waiting (Horovod failed under them, or is being reset)."""
        self.rounds.clear()
        release(self)

    def complete_in_flight(self):
        """Wait for every transfer of the rounds in flight (in_flight.py: at exit); the rounds stay pending."""
        for r in self.rounds.pending:
            for future in ([r.exchange] if r.exchange is not None else []) + list((r.transfers or {}).values()):
                self.be.wait(future)

    # ------------------------------------------------------------------------------------------ checkpoints
    def drained_rounds(self):
        """The rounds in flight, each transfer waited for (no new collective is started, so this is safe on one
        rank alone): [{step, due levels, election and apply steps, slot, gathered windows, leaders, values}]."""
        be, out = self.be, []
        for r in self.rounds.pending:
            exchange = be.copy([be.wait(r.exchange)])[0] if r.exchange is not None else None
            values = None if r.transfers is None else {name: be.copy(be.wait(t)) for name, t in r.transfers.items()}
            out.append({"step": r.step, "due": self.due_names(r.due),
                        "elect_at": r.elect_at, "apply_at": r.apply_at, "slot": r.slot, "exchange": exchange,
                        "leaders": r.leaders, "values": values})
        return out

    def load_rounds(self, saved):
        """Rounds in flight from a checkpoint (their transfers complete); [] drops what was in flight."""
        be = self.be
        self.rounds.clear()
        for d in saved:
            r = Round(int(d["step"]), self.due_mask(d["due"]), int(d["elect_at"]), int(d["apply_at"]), int(d["slot"]))
            r.exchange = None if d["exchange"] is None else be.done(be.copy([d["exchange"]])[0])
            if d["leaders"] is not None:
                r.leaders = {k: int(v) for k, v in d["leaders"].items()}
                r.pulls = self.pull_mask(r.due, r.leaders)
            r.transfers = None if d["values"] is None else {name: be.done(be.copy(values))
                                                            for name, values in d["values"].items()}
            self.rounds.pending.append(r)

    # ------------------------------------------------------------------------------------------ evaluation
    @contextlib.contextmanager
    def swapped_in(self, values):
        """The parameters hold `values` inside the block, their own again after it."""
        be = self.be
        saved = be.copy(be.parameters())
        be.assign_parameters(values)
        try:
            yield
        finally:
            be.assign_parameters(saved)


class LeaderStep(ConsensusStep):
    """LSGD and multi-leader LSGD (LeaderSync's levels)."""

    election_lag = 1  # asynchronous: the loss exchange started at an election step is read one step later

    def __init__(self, sync, be, state, stats, tag, numel, param_bytes):
        super().__init__(sync, be, state, stats, tag, numel, param_bytes)
        self.process_sets = be.level_groups(sync)

    def account_rounds(self, step):
        due = self.sync.due(step)
        self.sync.account(self.stats, due, self.param_bytes, self.be.nranks)
        return due

    def due_names(self, due):
        """A checkpoint's record of a due mask: the levels' names."""
        return [level.name for level in self.sync.levels_in(due)]

    def due_mask(self, names):
        return self.sync.mask_of(names)

    def pull_mask(self, due, leaders):
        """On the host: the levels of the due mask whose leader is another rank (the levels this rank pulls on)."""
        return sum(1 << i for i, level in enumerate(self.sync.levels)
                   if int(due) >> i & 1 and leaders[level.name] != self.be.rank)

    def elect_on_host(self, windows, step, due):
        """On the host: the leaders from every rank's (sum, count) window (raises on every rank: the same numbers
        everywhere). Returns each level's leader as an index into its members, the best rank, the pull mask."""
        self.state.shared_state_read(self)
        leaders = self.sync.elect([(float(s), int(c)) for s, c in windows], int(step))
        self.state.shared_state_written(self)
        return tuple(level.members.index(leaders[level.name]) for level in self.sync.levels) + \
            (self.sync.best_rank, self.pull_mask(due, leaders))

    def start(self, r):
        """The loss exchange: every rank's window in one allgather; a new window starts."""
        r.exchange = self.be.allgather(self.state.loss_window(), self.name("losses", r.slot))
        self.state.reset_loss_window()

    def elect(self, r):
        """Elect from the exchange; start each due level's broadcast of its leader's parameters as they are now."""
        be, sync = self.be, self.sync
        picked = be.host(self.elect_on_host, [be.wait(r.exchange), r.step, r.due],
                         ("int32",) * (len(sync.levels) + 2))
        r.pulls = picked[-1]
        if self.rounds.asynchronous:  # eager: the leaders are known here, and a checkpoint records them
            r.leaders = dict(sync.leaders)
        current, r.transfers = be.parameters(), {}
        for i, (level, source) in enumerate(self.sources()):
            due = be.bit(r.due, i)
            if source is not level or due is False:  # False: known on the host, nothing to build
                continue
            r.transfers[level.name] = be.cond(
                due, lambda i=i, level=level: be.broadcast(current, picked[i], level, self.name(level.name, r.slot)),
                lambda: be.done(list(current)))

    def apply(self, r):
        """x += sum_k w_k (x_k - x) over the round's levels this rank pulls on, every force from the same x (the
        parameters now). Returns what a graph must run."""
        be = self.be
        values = {name: be.wait(t) for name, t in r.transfers.items()}
        forces, current = None, be.parameters()
        for i, (level, source) in enumerate(self.sources()):
            pulls = be.bit(r.pulls, i)
            if source is None or pulls is False:
                continue
            target = be.cond(pulls, lambda s=source: list(values[s.name]), lambda: list(current))
            forces = add_pull(forces, target, current, level.weight)
        return be.add_to_parameters(forces)

    def sources(self):
        """(level, the level whose broadcast delivers its leader's parameters, or None: it does not pull)."""
        sources = self.sync.transfer_levels(self.sync.levels)
        return [(level, sources.get(level.name)) for level in self.sync.levels]

    def evaluation_values(self, which):
        """which="leader": the best worker's parameters of the last election (one broadcast; rank 0 before the
        first); "center": the workers' average (one allreduce)."""
        be = self.be
        if which == "center":
            return be.wait(be.allreduce_mean(be.copy(be.parameters()), self.name("evaluate_center")))
        self.state.shared_state_read(self)
        return be.wait(be.broadcast(be.parameters(), self.sync.best_rank, None, self.name("evaluate")))


class ElasticStep(ConsensusStep):
    """EASGD (ElasticSync): the center starts as the workers' mean at the first step."""

    def schedule_inputs(self):
        return [self.state.center_ready()]

    def account_rounds(self, step, ready):
        if not ready:  # the center's initialization: one allreduce of the parameters
            self.sync.account(self.stats, self.param_bytes, self.be.nranks)
        due = self.sync.due(step)
        if due:
            self.sync.account(self.stats, self.param_bytes, self.be.nranks)
        return due

    @staticmethod
    def due_names(due):
        return None  # one level: a round's record needs no names

    @staticmethod
    def due_mask(names):
        return 1

    def initialize_center(self):
        be = self.be
        return self.state.set_center(be.wait(be.allreduce_mean(be.copy(be.parameters()), self.name("center"))))

    def prepare(self):
        """The center starts as the workers' mean, at the first step."""
        be = self.be
        return be.when(self.state.center_ready(), lambda: None, otherwise=self.initialize_center)

    def start(self, r):
        r.transfers = {"mean": self.be.allreduce_mean(self.be.copy(self.be.parameters()), self.name("round", r.slot))}

    def elect(self, r):
        """EASGD elects no one."""

    def apply(self, r):
        """From the values before the round: x += alpha (center - x); center = (1 - beta) center + beta mean."""
        be, sync = self.be, self.sync
        means = be.wait(r.transfers["mean"])
        current, old = be.parameters(), self.state.center()
        forces = [(c - x) * sync.alpha for c, x in zip(old, current)]
        stored = self.state.set_center([c * (1.0 - sync.beta) + m * sync.beta for c, m in zip(old, means)])
        return be.after(stored, lambda: be.add_to_parameters(forces))

    def evaluation_values(self, which):
        """EASGD's center (no communication once training started; every rank holds the same center)."""
        be = self.be
        if not self.state.center_ready():  # evaluated before the first step: the workers' mean
            self.sync.account(self.stats, self.param_bytes, be.nranks)
            self.initialize_center()
        return self.state.center()
