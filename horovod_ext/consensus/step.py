"""The whole step of LSGD, multi-leader LSGD and EASGD, written once over a ParameterBackend (backend.py): the
schedule, the byte accounting, the election, the pulls, EASGD's update, the asynchronous rounds, checkpoints of
what is in flight, and the evaluation swap. The adapters (horovod_ext/torch/leader.py,
horovod_ext/tensorflow/leader.py) supply the backend and Horovod's API around it; the bookkeeping (arguments,
groups, election rule) is leader.py's LeaderSync and elastic.py's ElasticSync.

A step, before the local optimizer's own:
 1. the step is counted, and on the host (schedule): the dense reference (what data-parallel SGD's allreduce of
    the gradients would send) and the bytes of the rounds that start now are accounted, and the due mask taken;
 2. synchronously, the round due now runs whole (rounds.py has the asynchronous schedule):
    LSGD   every rank's loss window in one allgather, the leaders elected on the host (the same numbers on every
           rank: the same leaders), each level's leader broadcast (one broadcast serves levels with the same
           members, LeaderSync.transfer_levels), and the pull, every force from the same x:
               x <- x + sum over due levels of w_level * (x_leader - x)
    EASGD  the workers' mean in one allreduce, and from the values before the round
               x <- x + alpha * (center - x),   center <- (1 - beta) * center + beta * mean,   alpha = beta / N;
 3. the step's statistics end.
A level whose leader is this rank, or that is not due, adds (x - x) * w = 0: the same bits as no pull.
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

    def __init__(self, sync, be, stats, tag, numel, param_bytes):
        self.sync, self.be, self.stats, self.tag = sync, be, stats, tag
        self.numel, self.param_bytes = numel, param_bytes
        self.rounds = Rounds(sync.staleness, sync.period, lag=self.election_lag)
        if self.rounds.asynchronous and not be.asynchronous:
            raise ValueError(f"{sync.what}: this backend has no asynchronous collectives; use asynchronous=False")

    def name(self, *parts):
        return ".".join([self.tag, *map(str, parts)])

    def step(self):
        """Run this step's communication (before the local optimizer step). Returns what a graph must run first."""
        be = self.be
        step = be.advance_step()
        with be.timed():
            if self.rounds.asynchronous:  # eager: Python values
                self.schedule(step, *self.schedule_inputs())
                self.asynchronous(int(step))
                (hold if self.rounds.pending else release)(self)  # completed at exit if still in flight
                done = None
            else:
                due, = be.host(self.schedule, [step, *self.schedule_inputs()], ("int32",))
                done = self.synchronous(step, due)
        return be.after(done, lambda: be.host(self.end_step, [], ("int32",)))

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
        self.be.shared_state_read(self)
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
            out.append({"step": r.step, "due": None if r.due is None else [level.name for level in r.due],
                        "elect_at": r.elect_at, "apply_at": r.apply_at, "slot": r.slot, "exchange": exchange,
                        "leaders": r.leaders, "values": values})
        return out

    def load_rounds(self, saved):
        """Rounds in flight from a checkpoint (their transfers complete); [] drops what was in flight."""
        be = self.be
        levels = {level.name: level for level in getattr(self.sync, "levels", [])}
        self.rounds.clear()
        for d in saved:
            r = Round(int(d["step"]), None if d["due"] is None else [levels[n] for n in d["due"]], int(d["elect_at"]),
                      int(d["apply_at"]), int(d["slot"]))
            r.exchange = None if d["exchange"] is None else be.done(be.copy([d["exchange"]])[0])
            r.leaders = None if d["leaders"] is None else {k: int(v) for k, v in d["leaders"].items()}
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

    def __init__(self, sync, be, stats, tag, numel, param_bytes):
        super().__init__(sync, be, stats, tag, numel, param_bytes)
        from .agreement import level_process_sets
        self.process_sets = level_process_sets(sync, be.nranks, be.add_process_set)

    def account_rounds(self, step):
        due = self.sync.due(step)
        self.sync.account(self.stats, due, self.param_bytes, self.be.nranks)
        return sum(1 << i for i, level in enumerate(self.sync.levels) if level in due)

    def elect(self, windows, step):
        """On the host: the leaders from every rank's (sum, count) window (raises on every rank: the same numbers
        everywhere). Returns each level's leader as an index into its members, then the best rank."""
        self.be.shared_state_read(self)
        leaders = self.sync.elect([(float(s), int(c)) for s, c in windows], int(step))
        self.be.shared_state_written(self)
        return tuple(level.members.index(leaders[level.name]) for level in self.sync.levels) + (self.sync.best_rank,)

    def synchronous(self, step, due):
        return self.be.when(due, lambda: self.round(step, due))

    def round(self, step, due):
        be, sync = self.be, self.sync
        windows = be.wait(be.allgather(be.loss_window(), self.name("losses")))
        be.reset_loss_window()
        picked = be.host(self.elect, [windows, step], ("int32",) * (len(sync.levels) + 1))
        current = be.parameters()
        sources = sync.transfer_levels(sync.levels)
        received, forces = {}, None
        for i, level in enumerate(sync.levels):
            if level.name not in sources:
                continue
            source = sources[level.name]
            if source.name != level.name:  # the same members, due whenever this level is: its leader's values
                targets = be.cond(be.bit(due, i), lambda s=received[source.name]: list(s), lambda: list(current))
            else:
                targets = be.cond(be.bit(due, i), lambda i=i, level=level: be.wait(
                    be.broadcast(current, picked[i], level, self.name(level.name))),
                    lambda: list(current))
                received[level.name] = targets
            forces = add_pull(forces, targets, current, level.weight)
        return be.add_to_parameters(forces)

    def asynchronous(self, step):
        """rounds.py's schedule: start the round due now (the loss exchange), elect the rounds whose election is
        due (their broadcasts send the parameters as they are now), apply the rounds whose pull is due."""
        be, sync, rounds = self.be, self.sync, self.rounds
        due = sync.due(step)
        if due:
            started = rounds.start(step, due)
            started.exchange = be.allgather(be.loss_window(), self.name("losses", started.slot))
            be.reset_loss_window()
        for r in rounds.electing(step):
            be.host(self.elect, [be.wait(r.exchange), r.step], ("int32",) * (len(sync.levels) + 1))
            r.leaders = dict(sync.leaders)
            current = be.parameters()
            r.transfers = {name: be.broadcast(current, source.members.index(r.leaders[name]), source,
                                              self.name(name, r.slot))
                           for name, source in sync.transfer_levels(r.due).items() if source.name == name}
        for r in rounds.applying(step):
            self.pull(r)

    def pull(self, r):
        """x += sum_k w_k (x_k - x) over the round's levels whose leader is another rank, every force from the
        same x (the parameters now)."""
        be = self.be
        values = {name: be.wait(t) for name, t in r.transfers.items()}
        sources = self.sync.transfer_levels(r.due)
        targets = [(level.weight, values[sources[level.name].name]) for level in r.due
                   if level.name in sources and r.leaders[level.name] != be.rank]
        forces, current = None, be.parameters()
        for weight, target in targets:
            forces = add_pull(forces, target, current, weight)
        be.add_to_parameters(forces)

    def evaluation_values(self, which):
        """which="leader": the best worker's parameters of the last election (one broadcast; rank 0 before the
        first); "center": the workers' average (one allreduce)."""
        be = self.be
        if which == "center":
            return be.wait(be.allreduce_mean(be.copy(be.parameters()), self.name("evaluate_center")))
        be.shared_state_read(self)
        return be.wait(be.broadcast(be.parameters(), self.sync.best_rank, None, self.name("evaluate")))


class ElasticStep(ConsensusStep):
    """EASGD (ElasticSync): the center starts as the workers' mean at the first step."""

    def schedule_inputs(self):
        return [self.be.center_ready()]

    def account_rounds(self, step, ready):
        if not ready:  # the center's initialization: one allreduce of the parameters
            self.sync.account(self.stats, self.param_bytes, self.be.nranks)
        due = self.sync.due(step)
        if due:
            self.sync.account(self.stats, self.param_bytes, self.be.nranks)
        return int(due)

    def initialize_center(self):
        be = self.be
        return be.set_center(be.wait(be.allreduce_mean(be.copy(be.parameters()), self.name("center"))))

    def synchronous(self, step, due):
        be = self.be
        started = be.when(be.center_ready(), lambda: None, otherwise=self.initialize_center)
        return be.after(started, lambda: be.when(due, lambda: self.apply(
            be.wait(be.allreduce_mean(be.copy(be.parameters()), self.name("round", 0))))))

    def apply(self, means):
        """From the values before the round: x += alpha (center - x); center = (1 - beta) center + beta mean."""
        be, sync = self.be, self.sync
        current, old = be.parameters(), be.center()
        forces = [(c - x) * sync.alpha for c, x in zip(old, current)]
        stored = be.set_center([c * (1.0 - sync.beta) + m * sync.beta for c, m in zip(old, means)])
        return be.after(stored, lambda: be.add_to_parameters(forces))

    def asynchronous(self, step):
        be, sync, rounds = self.be, self.sync, self.rounds
        if not be.center_ready():
            self.initialize_center()
        if sync.due(step):
            started = rounds.start(step, None)
            started.transfers = {"mean": be.allreduce_mean(be.copy(be.parameters()),
                                                           self.name("round", started.slot))}
        for r in rounds.applying(step):
            self.apply(be.wait(r.transfers["mean"]))

    def evaluation_values(self, which):
        """EASGD's center (no communication once training started; every rank holds the same center)."""
        be = self.be
        if not be.center_ready():  # evaluated before the first step: the workers' mean
            self.sync.account(self.stats, self.param_bytes, be.nranks)
            self.initialize_center()
        return be.center()
