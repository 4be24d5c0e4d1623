"""Compression.auto's step (AutoMethod), over the backend contract, for PyTorch and TensorFlow alike: every tensor
travels by the method of the candidate chosen for it; measuring and deciding run eagerly on the host (__init__.py has
the run's story, choice.py the model and solver, measure.py the measurements).

Each candidate's method (registry.method_for: the static compressor's own plan, bytes, kernels and error feedback)
is made once, over every tensor, with two proxies: its backend names its collectives and residuals after the
candidate (``CandidateBackend``: two candidates keep apart residuals of one tensor), and its step context
(``BranchContext``) records requirements and byte counts where the candidate runs inside a branch of a traced step.

- Eagerly (PyTorch; TensorFlow outside tf.function) a gradient is launched by its candidate's method as soon as it
  is ready, and the step is finished per candidate.
- Inside tf.function each tensor is one ``switch`` over the candidates (and the carry of a residual, below), whose
  index a host call gives at the step's start: the chosen branch runs the candidate's launch and finish for that
  tensor alone, with its assertions and byte counts kept inside it and returned (the step's outputs wait for them).
  The deciding step's measurements, later measurements and the step's end (the window's agreement and decision, by
  Horovod's eager collectives) are host calls; the step's last host call runs after every tensor's collectives.

A tensor that moves keeps its error-feedback residual: into the new candidate's residual where that one keeps
residuals (moved on the host, between steps); else its next gradient is sent dense as g + r (every candidate's
residual of it, after which each is 0): the carry. During the trials a tensor moved onto a candidate without error
feedback leaves its residual where it is (parked), used again when the tensor returns, carried once the trials are
over if it has not.
"""
import collections
import contextlib
import math
import statistics
import sys
import time
import types

from horovod_ext.compression.context import ERROR_PREFIXES
from horovod_ext.compression.plan import DenseSplit, Item, Method, Record, count_dense
from horovod_ext.compression.wire import allreduce_wire_bytes
from ..powersgd import PowerSGD
from .choice import KINDS, TRIALS, Link, Option, confirmed, decide_measured, guard_gain, guarded, predicted_step
from .measure import LINEAR, WARM_ITERATIONS, Measures, floats, probe_link, round_trip, sent_dense, short_name

MEASURED_WINDOWS = 10  # a window's timed step counts for this many windows (then only its assignment's last one)
MEASURE_SEED = 0x6175746F  # the measurements' random draws (ternary's), apart from any step's
RECENT_INTERVALS = 20  # the step intervals the measuring budget's typical step is the median of
COUNTED = ("payload_bytes", "wire_bytes", "dense_bytes", "dense_wire_bytes", "elements", "compressed_elements")


class CandidateBackend:
    """The backend as one candidate's method sees it: its residuals and collectives named after the candidate."""

    def __init__(self, be, index):
        self._be, self._tag = be, f"auto{index}"

    def __getattr__(self, name):
        return getattr(self._be, name)

    def residual(self, name, n, item=None):
        return self._be.residual(f"{self._tag}.{name}", n, item)

    def imported_residual(self, name, values):
        return self._be.imported_residual(f"{self._tag}.{name}", values)

    def name(self, prefix, item):
        return self._be.name(f"{prefix}.{self._tag}", item)


class BranchContext:
    """The step context as the candidates' methods see it: the adapter's, except while one candidate's branch of a
    traced step is built (``capturing``), when requirements become assertions kept in the branch and byte counts are
    kept to be returned by it."""

    def __init__(self, ctx):
        self.__dict__.update(_ctx=ctx, _capture=None)

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def __setattr__(self, name, value):
        setattr(self._ctx, name, value)

    @contextlib.contextmanager
    def capturing(self):
        capture = types.SimpleNamespace(guards=[], counts={}, runtime=[])
        self.__dict__["_capture"] = capture
        try:
            yield capture
        finally:
            self.__dict__["_capture"] = None

    def require(self, truth, detail, value=None, error="nonfinite"):
        capture = self._capture
        if capture is None:
            return self._ctx.require(truth, detail, value, error)
        head, _, tail = detail.partition("{}")
        data = [ERROR_PREFIXES[error] + head] + ([value, tail] if value is not None else [])
        capture.guards.append(self._ctx.be.assertion(truth, data))

    def guarded(self, x):
        capture = self._capture
        if capture is None:
            return self._ctx.guarded(x)
        return self._ctx.be.after(capture.guards, x) if capture.guards else x

    def failed(self):
        return False if self._capture is not None else self._ctx.failed()

    def count(self, **amounts):
        if self._capture is None:
            return self._ctx.count(**amounts)
        for key, value in amounts.items():
            self._capture.counts[key] = self._capture.counts.get(key, 0) + value

    def count_runtime(self, **amounts):
        if self._capture is None:
            return self._ctx.count_runtime(**amounts)
        self._capture.runtime.extend(amounts.items())


def kept_timings(measured, windows):
    """The timed windows (assignment, seconds, window) that count: those of the last MEASURED_WINDOWS windows, and of
    an assignment with none among them its last one. An assignment's estimate is the mean of what counts of it
    (choice.measured_choice): a timing ages out where newer ones of the same assignment exist, and an assignment
    timed once stays known, so that it is not tried again on the model's estimate alone (an assignment timed slower
    in its trial was otherwise taken again once its timing had expired: benchmarks/RESULTS.md, section "Figures
    moved out of the package's docstrings (issue 67)")."""
    last = {}
    for entry in measured:
        last[entry[0]] = entry
    return [m for m in measured if windows - m[2] < MEASURED_WINDOWS or last[m[0]] is m]


def grown_budget(budget, share, interval, recent):
    """The measuring budget after a step of `interval` seconds: it grows by share x min(interval, typical), at most
    to 10 typical steps (a pair costlier than one step's share is measured once enough has grown). Typical is the
    median of the `recent` intervals (this one included), the least of them while fewer than 3: a pause between
    steps (an evaluation, another model's steps) grants no more than a step's share, wherever it falls in a window."""
    typical = statistics.median(recent) if len(recent) >= 3 else min(recent)
    return min(budget + share * min(interval, typical), 10 * typical)


class AutoRecord(Record):
    __slots__ = ()


class AutoMethod(Method):
    """See the module docstring and the package's (__init__.py)."""

    Record = AutoRecord

    def __init__(self, spec, ctx, sizes):
        super().__init__(spec, ctx, sizes)
        self.be = ctx.be
        self.branch_ctx = BranchContext(ctx)
        self.candidates = list(spec.candidates)
        self.names = self.index = None  # the tensors' names in the order of `sizes` (from the first step)
        self.shapes = {}
        self.subs = self.cbes = None  # per candidate: its method over every tensor, and its backend
        self.assignment = None  # candidate index per tensor (None: not decided yet)
        self.link = self.link_ranks = None  # choice.Link, and the N it was fitted at
        self.gains = self.kernel = self.nbytes = None  # [t][c]: the agreed mean gain, kernel seconds, bytes
        self.held = None  # [t][c]: [gain, window] of the last window the candidate was in force on the tensor
        self.compute = self.overlap = 0.0
        self.window_step = 0  # steps taken in the current window
        self.steps = 0  # steps this method has taken
        self.measures = None
        self.carry = set()  # tensors whose next gradient is sent dense with every residual of theirs
        self.parked = set()  # tensors on a trial whose residual waits in the error-feedback candidate that kept it
        self.residuals = {}  # a checkpoint's residuals (or a reset's) waiting for the methods
        self.resume_from = None  # the choice to start from at a deciding step after an elastic reset
        self.deferred = []  # the eager deciding step's items, launched once the decision is taken
        self.cursor = 0  # the round robin of measurements
        self.budget = 0.0  # measuring seconds still allowed
        self.recent = collections.deque(maxlen=RECENT_INTERVALS)  # the last steps' intervals, across windows
        self.pending = {}  # this step's measurements: tensor -> candidates
        self.step_started = self.last_launch = self.ended_at = None  # host clock
        self.step_kernels = 0.0  # seconds measured in this step's launches
        self.predicted = None  # predicted step seconds of the choice in force
        self.measured = []  # (tuple(assignment), its timed step seconds, the window) per timed window, at this N
        self.windows = 0  # windows ended at this N
        self.timed_windows = 0  # windows whose step was timed, at this N (the TRIALS after the first are trials)
        self.proposed = None  # rank 0's switch chosen at the last window's end, waiting for a second (confirmed)
        self.changes = 0
        self.codec = AllCodecs(self)

    # ------------------------------------------------------------------------------------------- join checks
    # Every step asks, whatever the choice: a window is counted in the steps every rank takes, so that its end (the
    # agreement's collectives) comes at the same step on every rank; a step in which a rank has joined goes dense
    # and is not counted (finish_dense). With "none" and "fp16" alone the check is read at finish() and overlaps
    # backward (join_decided_at_finish).
    needs_join_check = True

    @property
    def join_decided_at_finish(self):
        """Whether every chosen method's launch() serves a joined step too (driver.py)."""
        return self.assignment is not None and all(
            self._method_class(c).join_decided_at_finish or not self._method_class(c).needs_join_check
            for c in set(self.assignment))

    def _method_class(self, c):
        from horovod_ext.compression.registry import method_for
        spec = self.candidates[c]
        return method_for(self.be.linear_compressor(spec) if spec in LINEAR else spec)

    # ---------------------------------------------------------------------------------------- the candidates
    def _know(self, be, items):
        """The tensors' names and shapes, and every candidate's method over them (once)."""
        if self.names is None:
            self.names = [None] * len(self.sizes)
            for item in items:
                self.names[item.index] = item.name
                self.shapes[item.name] = tuple(int(d) for d in be.shape(item.grad))
            self.index = {name: t for t, name in enumerate(self.names)}
        if self.subs is None:
            from horovod_ext.compression.registry import method_for
            self.subs, self.cbes = [], []
            for c, spec in enumerate(self.candidates):
                spec = be.linear_compressor(spec) if spec in LINEAR else spec
                self.subs.append(method_for(spec)(spec, self.branch_ctx, self.sizes))
                self.cbes.append(CandidateBackend(be, c))
            for c, sub_state in getattr(self, "shared_subs", {}).items():
                self.subs[int(c)].load_shared_state(sub_state)
            if self.residuals:
                residuals, self.residuals = self.residuals, {}
                self._load_residuals(be, residuals)

    def _kind_bytes(self, t, c):
        """(collective kind, bytes per rank, or None where measured) of candidate c on tensor t."""
        cand, n = self.candidates[c], self.sizes[t]
        if cand == "none" or sent_dense(cand, n):
            return "allreduce", 4.0 * n
        if cand == "fp16":
            return "allreduce", 2.0 * n
        if isinstance(cand, PowerSGD):  # its factors, or 4 n where the tensor goes dense (PowerSGD.payload_bytes)
            shape = self.shapes[self.names[t]]
            return ("allreduce" if cand.layout(shape) is None else "factors"), float(cand.payload_bytes(shape))
        return "allgather", None

    def allowed(self, t, c):
        return self.candidates[c] in LINEAR or self.sizes[t] >= self.spec.min_size

    def keeps_residuals(self, c):
        return getattr(self.subs[c].codec, "holds_residuals", False)

    def residual_states(self, name, but=None):
        """The residual states of tensor `name` held by error-feedback candidates (other than `but`); one at most is
        not 0 (a moved residual goes into the new candidate's or waits parked in its old one)."""
        return [self.subs[c].codec.residuals[name] for c in range(len(self.subs))
                if c != but and self.keeps_residuals(c) and name in self.subs[c].codec.residuals]

    @staticmethod
    def plus_residuals(be, x, states):
        """x + the residuals in `states`."""
        for state in states:
            x = be.sub(x, be.scale(be.read(state), -1.0))
        return x

    @property
    def exploring(self):
        """Whether the windows are still those of the first choice and its trials (choice.TRIALS)."""
        return self.timed_windows <= TRIALS

    # ------------------------------------------------------------------------------------- an eager step
    def launch(self, be, item):
        if be.building_graph():
            item.kind = "traced"
            return item
        if self.assignment is None:
            self.deferred.append(item)
            item.kind = "deferred"
            return item
        if self.subs is None:  # a checkpoint's choice, before this process's first step
            self._know(be, [])
        if self.step_started is None:
            self.step_started, self.step_kernels = time.perf_counter(), 0.0
            self._plan_measures()
        t = self.index[item.name]
        if t in self.pending:
            start = time.perf_counter()
            self._measure(be, t, item.grad, self.pending[t])
            self.step_kernels += time.perf_counter() - start
        self.last_launch = time.perf_counter()
        return self._dispatch(be, item, t)

    def _dispatch(self, be, item, t):
        if self.names[t] in self.carry:
            self.carry.discard(self.names[t])
            item.work = AutoRecord()
            return self._carry_launch(be, item, t)
        c = self.assignment[t]
        item.work = self.subs[c].Record()
        return self.subs[c].launch(self.cbes[c], item)

    def _carry_launch(self, be, item, t, ctx=None):
        """g + r, r being every candidate's residual of the tensor (one at most is not 0), by allreduce; each r = 0."""
        ctx = ctx or self.ctx
        item.kind = "small"
        count_dense(ctx, item)
        flat = be.flat32(item.grad)
        held = self.residual_states(item.name)
        flat = be.copy(self.plus_residuals(be, flat, held))
        for state in held:
            be.reset(state)
        item.future = be.allreduce(flat, be.name("auto.carry", item), "sum" if be.divisor == 1.0 else "average")
        ctx.count(payload_bytes=4 * item.numel, wire_bytes=allreduce_wire_bytes(4 * item.numel, be.nranks))
        return item

    def finish(self, be, items):
        if be.building_graph():
            return self._traced_step(be, items)
        if self.deferred:
            self._deciding_step(be)
        by_candidate = {}
        for item in items:
            if isinstance(item.work, AutoRecord):  # a carry
                DenseSplit.finish(be, self.ctx, [item])
            else:
                by_candidate.setdefault(self.assignment[self.index[item.name]], []).append(item)
        for c in sorted(by_candidate):
            self.subs[c].finish(self.cbes[c], by_candidate[c])
        self._step_ended(be)

    def launch_dense(self, be, item):
        if self.assignment is None:  # nothing decided yet: the step goes as Horovod's
            return DenseSplit.launch(be, self.ctx, item)
        c = self.assignment[self.index[item.name]]
        item.work = self.subs[c].Record()
        return self.subs[c].launch_dense(self.cbes[c], item)

    def finish_dense(self, be, items):
        """A step in which a rank had joined: not one of the window's steps (its launches' measurements stay; the
        interval to the next step is not timed)."""
        self.step_started = self.last_launch = self.ended_at = None
        if self.assignment is None:
            return DenseSplit.finish(be, self.ctx, items)
        by_candidate = {}
        for item in items:
            if isinstance(item.work, AutoRecord):  # a carry (launch() in a step whose check is read at finish)
                DenseSplit.finish(be, self.ctx, [item])
            else:
                by_candidate.setdefault(self.assignment[self.index[item.name]], []).append(item)
        for c in sorted(by_candidate):
            self.subs[c].finish_dense(self.cbes[c], by_candidate[c])

    def _deciding_step(self, be):
        """The eager deciding step: measure, agree, decide; then launch the step's gradients as decided."""
        items = sorted(self.deferred, key=lambda i: i.index)
        self.deferred = []
        self._decide_first(be, items)
        for item in items:
            self._dispatch(be, item, self.index[item.name])

    def _decide_first(self, be, items):
        """Probe the link (unless fitted at this N), measure every candidate on every gradient, agree and decide."""
        self._know(be, items)
        if self.link is None:
            largest = max(items, key=lambda i: i.numel)
            self.link = probe_link(be, be.copy(be.flat32(largest.grad)), self.spec.probe_seconds, self.changes)
            self.link_ranks = be.nranks
        self.measures = Measures(len(self.sizes), len(self.candidates))
        for item in items:
            t = self.index[item.name]
            self._measure(be, t, item.grad, [c for c in range(len(self.candidates)) if self.allowed(t, c)])
        current = self.assignment or self.resume_from or [0] * len(self.sizes)
        self.resume_from = None
        self._agree_and_decide(be, current)

    # ------------------------------------------------------------------------------------- a traced step
    def _traced_step(self, be, items):
        """The step inside tf.function (module docstring)."""
        items = sorted(items, key=lambda i: i.index)
        ntensors = len(self.sizes)
        if self.names is None:
            for item in items:
                self.shapes[item.name] = tuple(int(d) for d in be.shape(item.grad))
        with be.scope("auto"):
            self._know(be, items)
            plan, = be.host(self._host_plan, [], ("int32",))
            planned = be.unstack(plan, 2 * ntensors + 1)
            grads = [be.after([plan], be.flat32(item.grad)) for item in items]  # the plan first
            decided = be.eager(lambda *xs: self._host_decide_first(be, items, xs), grads, ("int32",))[0]
            decided = be.unstack(decided, ntensors)
            outputs = []
            for item, flat, t in zip(items, grads, range(ntensors)):
                be.switch(planned[ntensors + t], [lambda: [be.no_flag()],
                                                  lambda t=t, flat=flat: [self._host_measure(be, t, flat)]])
                index = be.switch(planned[-1], [lambda t=t: [planned[t]], lambda t=t: [decided[t]]])[0]
                out = be.switch(index, [lambda c=c, item=item: self._branch(be, item, c)
                                        for c in range(len(self.candidates))]
                                + [lambda item=item, t=t: self._carry_branch(be, item, t)])
                avg, counted = out[0], out[1]
                self.ctx.count_runtime(**dict(zip(COUNTED, be.unstack(counted, len(COUNTED)))))
                be.write(item, avg)
                outputs.append(avg)
            ended, = be.host(lambda *_: self._step_ended(be) or 0, [be.after(outputs, be.no_flag())], ("int32",))
            self.ctx.guards.append(ended)

    def _branch(self, be, item, c):
        """Candidate c's launch and finish of one tensor inside a traced step: [its average (flat), its counts]."""
        sub, cbe = self.subs[c], self.cbes[c]
        copy = Item(item.index, item.name, item.grad, item.numel, item.itemsize)
        copy.work = sub.Record()
        with self.branch_ctx.capturing() as capture:
            sub.launch(cbe, copy)
            sub.finish(cbe, [copy])
        return self._branch_outputs(be, be.flat32(copy.result), capture)

    def _carry_branch(self, be, item, t):
        copy = Item(item.index, item.name, item.grad, item.numel, item.itemsize)
        with self.branch_ctx.capturing() as capture:
            self._carry_launch(be, copy, t, self.branch_ctx)
            avg = be.wait(copy.future)
        return self._branch_outputs(be, avg, capture)

    @staticmethod
    def _branch_outputs(be, avg, capture):
        counts = {key: 0.0 for key in COUNTED}
        for key, value in capture.counts.items():
            if key in counts:
                counts[key] = counts[key] + value
        parts = {key: [] for key in COUNTED}
        for key, value in capture.runtime:
            if key in parts:
                parts[key].append(be.cast(value, "float64") if not isinstance(value, (int, float)) else value)
        values = [be.sum([be.stack([counts[key]], "float64")[0]] + parts[key]) if parts[key] else counts[key]
                  for key in COUNTED]
        counted = be.stack(values, "float64")
        if capture.guards:
            avg, counted = be.after(capture.guards, avg), be.after(capture.guards, counted)
        return [avg, counted]

    def _host_plan(self):
        """This step's branch per tensor (its candidate, or len(candidates): the carry), which tensors are measured,
        whether it is the deciding step."""
        ntensors = len(self.sizes)
        if self.assignment is None:
            return [0] * (2 * ntensors) + [1]
        self.step_started, self.step_kernels = time.perf_counter(), 0.0
        self._plan_measures()
        branches = [len(self.candidates) if self.names[t] in self.carry else c for t, c in enumerate(self.assignment)]
        self.carry = set()
        return branches + [int(t in self.pending) for t in range(ntensors)] + [0]

    def _host_decide_first(self, be, items, xs):
        """The traced deciding step's host call, on the gradients as eager tensors: the choice (unchanged when this
        is not the deciding step)."""
        if self.assignment is None:
            probes = [Item(item.index, item.name, be.reshape(x, self.shapes[item.name]), item.numel, item.itemsize)
                      for item, x in zip(items, xs)]
            self._decide_first(be, probes)
        return be.stack(list(self.assignment), "int32")

    def _host_measure(self, be, t, flat):
        def measure(x):
            start = time.perf_counter()
            self._measure(be, t, x, self.pending.get(t, []))
            self.step_kernels += time.perf_counter() - start
            return be.no_flag()
        return be.eager(measure, [flat], ("int32",))[0]

    # ------------------------------------------------------------------------------------------ measuring
    def _measure(self, be, t, grad, candidates):
        """Candidates' gain, kernel seconds and payload bytes on what each would encode once chosen: a candidate
        with error feedback on x = g + r (r: the tensor's residual now, which moves into it), one without on g
        (the residual is carried once, then its payloads carry g alone: an entropy-coded ternary payload of a
        sparse g is far smaller than of g + a dense residual)."""
        name = self.names[t]
        g = be.flat32(grad)
        x = self.plus_residuals(be, g, self.residual_states(name))
        item = Item(t, name, grad, self.sizes[t], 4)
        # the codecs' own context: the draws' key (not the step's: a traced step's are graph tensors), no statistics
        ctx = types.SimpleNamespace(seed=MEASURE_SEED, step=self.steps, stats=types.SimpleNamespace(extra={}), be=be)
        for c in candidates:
            encoded = x if self.keeps_residuals(c) else g
            self.measures.add(t, c, *round_trip(be, ctx, item, encoded, self.candidates[c], self.shapes[name]))

    def _plan_measures(self):
        """This step's measurements: (tensor, candidate) pairs round robin, the chosen candidates first, while their
        kernel seconds fit in the budget (measure_share of the steps' time)."""
        self.pending = {}
        pairs = [(t, self.assignment[t]) for t in range(len(self.sizes))
                 if self.candidates[self.assignment[t]] != "none"]
        pairs += [(t, c) for t in range(len(self.sizes)) for c in range(len(self.candidates))
                  if self.allowed(t, c) and self.candidates[c] != "none" and c != self.assignment[t]]
        spent = 0.0
        for _ in range(len(pairs)):
            t, c = pairs[self.cursor % len(pairs)]
            cost = self.kernel[t][c] if math.isfinite(self.kernel[t][c]) else 0.0
            if isinstance(self.candidates[c], PowerSGD):  # its untimed warming iterations cost about a step each
                cost *= 1 + WARM_ITERATIONS
            if spent + cost > self.budget:
                break
            spent += cost
            self.pending.setdefault(t, []).append(c)
            self.cursor += 1
        self.budget -= spent

    def _step_ended(self, be):
        """The step's compute and overlap into the window's measurements; at the window's end, decide again."""
        now = time.perf_counter()
        interval = now - self.ended_at if self.ended_at is not None else None
        self.ended_at = now
        if interval is not None:
            self.measures.interval(interval)
            self.recent.append(interval)
            self.budget = grown_budget(self.budget, self.spec.measure_share, interval, self.recent)
        compute = self.ctx.stats.compute_seconds()
        if self.step_started is not None and compute is not None:
            overlap = max(0.0, (self.last_launch or self.step_started) - self.step_started - self.step_kernels)
            self.measures.step(compute, overlap)
        self.step_started = self.last_launch = None
        self.steps += 1
        self.window_step += 1
        if self.window_step >= self.spec.window:
            self._agree_and_decide(be, self.assignment)

    # ------------------------------------------------------------------------------------------ deciding
    def _agree_and_decide(self, be, current):
        """Average the window's measurements over ranks; rank 0 decides; every rank takes rank 0's decision (an
        allreduce in which the others send zeros: exact)."""
        vector = self.measures.vector()
        averaged = floats(be, be.wait(be.allreduce(be.stack(vector, "float64"),
                                                   be.step_name(f"auto.measures.{self.steps}"), "average")),
                          len(vector))
        self._take_measures(averaged, current)
        choice = self._decide(current) if be.rank == 0 else [0.0] * len(self.sizes)
        agreed = be.wait(be.allreduce(be.stack(choice, "float64"), be.step_name(f"auto.choice.{self.steps}"), "sum"))
        self.ctx.count_decided(payload_bytes=8 * (len(vector) + len(choice)),
                               wire_bytes=allreduce_wire_bytes(8 * len(vector), be.nranks)
                               + allreduce_wire_bytes(8 * len(choice), be.nranks))
        self._apply(be, [int(round(v)) for v in floats(be, agreed, len(choice))])
        self.measures = Measures(len(self.sizes), len(self.candidates))
        self.window_step = 0

    def _take_measures(self, averaged, current):
        ntensors, ncand = len(self.sizes), len(self.candidates)
        if self.gains is None:
            self.gains = [[None] * ncand for _ in range(ntensors)]
            self.held = [[None] * ncand for _ in range(ntensors)]
            self.kernel = [[math.nan] * ncand for _ in range(ntensors)]
            self.nbytes = [[math.nan] * ncand for _ in range(ntensors)]
        for t in range(ntensors):
            for c in range(ncand):
                gain_sum, count, seconds, nbytes = averaged[(t * ncand + c) * 4:(t * ncand + c + 1) * 4]
                if count > 0:
                    self.gains[t][c] = gain_sum / count
                    if self.assignment is not None and current[t] == c:  # a window (or step) ran it in force
                        self.held[t][c] = [self.gains[t][c], self.windows]
                    self.kernel[t][c] = seconds / count
                    self.nbytes[t][c] = nbytes / count
        compute, overlap, measured, interval, timed = averaged[-5:]
        if measured > 0:
            self.compute, self.overlap = compute, overlap
        if timed == 1.0 and self.assignment is not None:  # every rank timed a window of the choice in force
            self.measured.append((tuple(current), interval, self.windows))
            self.measured = kept_timings(self.measured, self.windows)
            self.timed_windows += 1
        self.windows += 1

    def gain(self, t, c):
        """The candidate's gain on the tensor as the guard reads it (choice.guard_gain): bounded off force by its
        gain in force where it keeps residuals (a candidate without reads g alone, in force or not)."""
        held = self.held[t][c] if self.held is not None else None
        if self.subs is not None and not self.keeps_residuals(c):
            held = None
        in_force = self.assignment is not None and self.assignment[t] == c
        return guard_gain(self.gains[t][c], held and held[0], in_force, self.windows - held[1] if held else 0)

    def options(self):
        """choice.Option per tensor and candidate from the agreed measurements (not allowed: no gain)."""
        out = []
        for t in range(len(self.sizes)):
            row = []
            for c in range(len(self.candidates)):
                kind, nbytes = self._kind_bytes(t, c)
                if nbytes is None:
                    nbytes = self.nbytes[t][c]
                kernel = self.kernel[t][c] if math.isfinite(self.kernel[t][c]) else 0.0
                usable = self.allowed(t, c) and math.isfinite(nbytes)
                row.append(Option(kind, nbytes if usable else 0.0, kernel, self.gain(t, c) if usable else None,
                                  always=self.candidates[c] == "none", join_check=self.candidates[c] not in LINEAR))
            out.append(row)
        return out

    def _decide(self, current):
        recent = {}  # each assignment's timed steps, one per timed window that counts (kept_timings)
        for plan, seconds, _ in self.measured:
            recent.setdefault(plan, []).append(seconds)
        options = self.options()
        chosen = decide_measured(options, self.link, self.compute, self.overlap, self.spec.epsilon, current,
                                 self.sizes, self.names, self.spec.margin, recent, self.exploring)
        if self.timed_windows > TRIALS + 1 and tuple(current) in recent:  # not the return from the last trial
            chosen, self.proposed = confirmed(chosen, guarded(options, current, self.spec.epsilon), self.proposed)
        return [float(c) for c in chosen]

    def _apply(self, be, assignment):
        """The agreed assignment in force from the next step: a moved tensor's residual goes to its new candidate
        where that one keeps residuals, else it is carried (module docstring)."""
        old = self.assignment
        if old != assignment:
            for t, (before, after) in enumerate(zip(old or assignment, assignment)):
                if old is not None and before != after:
                    self._move_residual(be, self.names[t], before, after)
            self.assignment = list(assignment)
            self.changes += 1
            self.predicted = predicted_step(self.options(), self.assignment, self.link, self.compute, self.overlap)
            self._report(old)
        else:
            self.predicted = predicted_step(self.options(), self.assignment, self.link, self.compute, self.overlap)
        if self.parked and not self.exploring:  # the trials are over: a tensor still off carries its r
            self.carry |= {n for n in self.parked if not self.keeps_residuals(self.assignment[self.index[n]])}
            self.parked = set()

    def _move_residual(self, be, name, before, after):
        """The tensor's residual (held by `before`, or parked in an earlier error-feedback candidate) into `after`
        where it keeps residuals. Else, while the trials run (one window each), it stays where it is and is used
        again if the tensor returns (a trial does not dump r at once: benchmarks/RESULTS.md, section
        "Compression.auto, time to the target at 2 ranks, third run"); after the trials it is carried."""
        if isinstance(self.candidates[after], PowerSGD):
            self.subs[after].warm = False  # its Q of this tensor is stale: every Q is drawn afresh at its next step
        states = self.residual_states(name, but=after)
        if self.keeps_residuals(after):
            self.parked.discard(name)
            if states:
                moved = self.plus_residuals(be, be.read(states[0]), states[1:])
                self.subs[after].load_state(self.cbes[after], {name: moved})
                for state in states:
                    be.reset(state)
        elif states and (self.keeps_residuals(before) or name in self.parked):
            if self.exploring:
                self.parked.add(name)
            else:
                self.parked.discard(name)
                self.carry.add(name)

    def _report(self, old):
        if self.be.rank != 0:
            return
        moved = sum(1 for t in range(len(self.sizes)) if old is None or old[t] != self.assignment[t])
        counts = {}
        for c in self.assignment:
            counts[short_name(self.candidates[c])] = counts.get(short_name(self.candidates[c]), 0) + 1
        print(f"horovod_ext auto: step {self.steps}: {moved} of {len(self.sizes)} tensors changed; now "
              + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
              + f"; predicted step {self.predicted * 1e3:.1f} ms", file=sys.stderr, flush=True)

    # --------------------------------------------------------------------------------------------- state
    def state(self, be):
        """This rank's residuals of every candidate, each key prefixed with the candidate's index ("2:fc.weight")."""
        out = dict(self.residuals)
        for c, sub in enumerate(self.subs or []):
            for name, value in sub.state(self.cbes[c]).items():
                out[f"{c}:{name}"] = value
        return out

    def load_state(self, be, residuals):
        if self.subs is None:
            self.residuals.update(residuals)
            return
        self._load_residuals(be, residuals)

    def _load_residuals(self, be, residuals):
        batches = {}
        for key, value in residuals.items():
            c, _, name = key.partition(":")
            if c.isdigit() and int(c) < len(self.subs):
                batches.setdefault(int(c), {})[name] = value
        for c, batch in batches.items():
            self.subs[c].load_state(self.cbes[c], batch)

    def shared_state(self):
        subs = {str(c): sub.shared_state() for c, sub in enumerate(self.subs or []) if sub.shared_state() is not None}
        return {"assignment": self.assignment, "names": self.names, "nranks": self.be.nranks,
                "shapes": [list(self.shapes[name]) for name in self.names] if self.names else None,
                "link": self.link.as_list() if self.link is not None else None, "gains": self.gains,
                "held": self.held, "kernel": self.kernel, "nbytes": self.nbytes, "compute": self.compute,
                "overlap": self.overlap, "window_step": self.window_step, "steps": self.steps,
                "carry": sorted(self.carry), "parked": sorted(self.parked), "subs": subs,
                "measured": [[list(plan), seconds, at] for plan, seconds, at in self.measured],
                "windows": self.windows, "timed_windows": self.timed_windows, "proposed": self.proposed}

    def load_shared_state(self, state):
        """A checkpoint's (or rank 0's) state: the choice continues where it was; with another number of ranks the
        link is measured again and the choice taken again (from this one) at the next step."""
        if state is None or state.get("names") is None:
            return
        self.names = list(state["names"])
        self.index = {name: t for t, name in enumerate(self.names)}
        self.shapes = {name: tuple(shape) for name, shape in zip(self.names, state["shapes"])}
        self.gains = state["gains"]
        same_ranks = state["nranks"] == self.be.nranks and state["link"] is not None
        held = state.get("held") or [[None] * len(self.candidates) for _ in self.names]
        # windows count again from 0 at another N: each held gain keeps its age (a window before 0)
        at = 0 if same_ranks else int(state.get("windows", 0))
        self.held = [[None if h is None else [h[0], h[1] - at] for h in row] for row in held]
        self.kernel = [[math.nan if v is None else v for v in row] for row in state["kernel"]]
        self.nbytes = [[math.nan if v is None else v for v in row] for row in state["nbytes"]]
        self.compute, self.overlap, self.steps = state["compute"], state["overlap"], int(state["steps"])
        self.measures = Measures(len(self.sizes), len(self.candidates))
        self.carry = set(state.get("carry", []))
        self.parked = set(state.get("parked", []))
        self.link = Link.from_list(state["link"]) if same_ranks else None
        self.link_ranks = self.be.nranks if same_ranks else None
        self.window_step = int(state["window_step"]) if same_ranks else 0
        measured = state.get("measured", []) if same_ranks else []
        self.measured = [(tuple(plan), seconds, at) for plan, seconds, at in measured]
        self.windows = int(state.get("windows", 0)) if same_ranks else 0
        self.timed_windows = int(state.get("timed_windows", 0)) if same_ranks else 0
        self.proposed = state.get("proposed") if same_ranks else None
        if same_ranks:
            self.assignment = state["assignment"]
        else:
            self.assignment, self.resume_from = None, state["assignment"]
        self.shared_subs = state.get("subs", {})
        if self.subs is not None:
            for c, sub_state in self.shared_subs.items():
                self.subs[int(c)].load_shared_state(sub_state)
        if self.assignment is not None:
            self.predicted = predicted_step(self.options(), self.assignment, self.link, self.compute, self.overlap)

    # ------------------------------------------------------------------------------------------ in flight
    def on_error(self, be):
        self.codec.reset_all(be)

    def abandon_step(self):
        for sub in self.subs or []:
            sub.abandon_step()
        self.deferred, self.step_started = [], None

    def complete_in_flight(self):
        for sub in self.subs or []:
            sub.complete_in_flight()

    def forget_in_flight(self):
        for sub in self.subs or []:
            sub.forget_in_flight()
        self.deferred, self.step_started = [], None

    def observations(self):
        """compression_stats()["choice"]: per tensor its candidate, bytes per rank, predicted seconds (its kernels
        and its bytes' time on the fitted link), measured kernel seconds and gain; the predicted step, the number of
        changes, the fitted link and the number of ranks it was fitted at."""
        if self.assignment is None:
            return {"choice": {}}
        options = self.options()
        choice = {}
        for t, c in enumerate(self.assignment):
            o = options[t][c]
            choice[self.names[t]] = {"method": short_name(self.candidates[c]), "bytes": o.nbytes,
                                     "predicted_seconds": self.link.slope[o.kind] * o.nbytes + o.kernel,
                                     "kernel_seconds": o.kernel,
                                     "gain": 1.0 if self.candidates[c] == "none" else o.gain}
        return {"choice": choice, "predicted_step_seconds": self.predicted, "choice_changes": self.changes,
                "link_ranks": self.link_ranks,
                "link": {k: {"latency": self.link.latency[k], "seconds_per_byte": self.link.slope[k]} for k in KINDS}}


class AllCodecs:
    """What the lifecycle asks of a method's codec, over every candidate's (a failed step, or a checkpoint without
    this rank's residuals: each starts from zero)."""

    holds_residuals = True

    def __init__(self, method):
        self.method = method

    def reset_all(self, be):
        for c, sub in enumerate(self.method.subs or []):
            sub.codec.reset_all(self.method.cbes[c])
        self.method.residuals, self.method.carry = {}, set()
