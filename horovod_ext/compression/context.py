"""A step's context: what a method's step reads and reports beside the backend's primitives, framework-free.

The step driver (driver.py) begins each step on it; a method (plan.Method) and its codec hold it from their
construction and use it for:

- the step's counter and random seed (``step``, ``seed``: ints eagerly, tensors while a graph is built), which the
  counter-based kernels take;
- requirements (``require``, ``decoding``): a NaN/Inf gradient or a corrupted payload, decided from collective
  results, so the same on every rank. Eagerly a truth that is a tensor (a finiteness flag, a decoder's flag) stays
  where it was computed (on the GPU for CUDA tensors) until the step's errors are asked for (``settled_errors``,
  or ``failed``): then all of the step's truths are read in one host read (``backend.all_true``), however many
  tensors the step has; each failure is recorded as (error, detail) and the driver raises the step's records once
  the step is finished. While a graph is built (TensorFlow inside tf.function) a truth becomes the backend's
  assertion op, which ``guarded`` makes a value wait for and the adapter makes the step's outputs wait for
  (``pending``);
- the statistics (``stats``: its ``extra`` dict of what the method chose, and the counted bytes and seconds).

Bytes are counted three ways: ``count`` what is known when the step is made (the same every step),
``count_decided`` what a host decision fixes (GraVAC's path, PowerSGD's start), ``count_runtime`` what only the
step's run knows (entropy-coded payloads, sparse gradients). Eager steps that run once per call (PyTorch) add all
three to ``stats`` as they come. A step built once and run many times (TensorFlow: a traced tf.function; its eager
steps count the same way) keeps ``count`` per step (``per_step``, the same every step), adds the decided ones as
their decisions are taken and the runtime ones as the steps run (a host op while a graph is built); ``totals``
adds them up.
"""
import contextlib

ERROR_PREFIXES = {"nonfinite": "NaN or Inf in the gradient of ", "payload": "corrupted payload of "}


def _add(into, amounts):
    for key, value in amounts.items():
        into[key] = into.get(key, 0) + value


class StepContext:
    """See the module docstring. ``timer(stats, field)``: a context manager that adds the seconds of its block to
    statistics field `field` (None: seconds are not measured, TensorFlow's). ``built_steps``: counts known when
    the step is made are kept per step (TensorFlow) instead of added to ``stats`` as they come (PyTorch)."""

    def __init__(self, stats, timer=None, built_steps=False):
        self.stats, self.timer, self.built_steps = stats, timer, built_steps
        self.be = None
        self.step = self.seed = None
        self.dense = False
        self.errors, self.guards, self.deferred = [], [], []
        self.per_step = {}  # built_steps: bytes counted while the step is made (the same every step)
        self.decided_total, self.decided_last = {}, {}  # built_steps: bytes counted at host decisions
        self.runtime_total, self.runtime_last = {}, {}  # built_steps: bytes counted as the steps run
        self.runtime = []  # while a graph is built: (field, tensor) of the step being made

    @property
    def nranks(self):
        return self.be.nranks

    def use(self, be):
        """The backend the steps run over (the step driver's, set before its method is made: a method made for
        another membership after an elastic reset gets the new backend)."""
        self.be = be

    def begin(self, step, seed, dense):
        """A step begins (eagerly: runs; in a graph: is built): its counter and seed, whether it goes dense (a
        rank has joined). Forgets the last step's requirements and per-step counts."""
        self.step, self.seed, self.dense = step, seed, dense
        self.errors, self.guards, self.runtime, self.deferred = [], [], [], []
        if self.built_steps:
            self.per_step = {}
            if not self.be.building_graph():
                self.runtime_last = {}

    # ------------------------------------------------------------------------------------------- requirements
    def require(self, truth, detail, value=None, error="nonfinite"):
        """Record a failed requirement unless `truth` (a bool, or a boolean tensor in a graph): `detail` with its
        "{}" filled with `value`. `error` is what the driver raises for it: "nonfinite" (FloatingPointError) or
        "payload" (a corrupted payload: ValueError). In a graph: an assertion whose message says the same."""
        if not self.be.building_graph():
            if isinstance(truth, bool):
                if not truth:
                    self._record(error, detail, value)
            else:  # a tensor: read with the step's other truths, in one host read (settled_errors)
                self.deferred.append((truth, detail, value, error))
            return
        head, _, tail = detail.partition("{}")
        data = [ERROR_PREFIXES[error] + head] + ([value, tail] if value is not None else [])
        self.guards.append(self.be.assertion(truth, data))

    @contextlib.contextmanager
    def decoding(self, item):
        """Around decoding one tensor's payloads: a kernel's rejection of a corrupted payload (one of the
        backend's ``kernel_errors``) is recorded as a "payload" requirement naming the tensor, and the rest of the
        block is skipped; in a graph the ops are named after the tensor, so the failing op says which."""
        if self.be.building_graph():
            with self.be.scope(f"decode.{item.name}"):
                yield
            return
        try:
            yield
        except self.be.kernel_errors as exc:
            self.reject(item, getattr(exc, "message", None) or exc)

    def reject(self, item, message):
        """Record that `item`'s payloads did not decode (a "payload" requirement naming the tensor), as decoding()
        does for a kernel's rejection: what a decoder of several tensors at once reports per tensor."""
        self.errors.append(("payload", f"{item.name!r}: {message}"))

    def _record(self, error, detail, value):
        self.errors.append((error, detail.replace("{}", str(int(value))) if value is not None else detail))

    def settled_errors(self):
        """The step's (error, detail) records so far, the truths still on the device read first: one host read
        (backend.all_true) for all of them."""
        if self.deferred:
            deferred, self.deferred = self.deferred, []
            for ok, (_, detail, value, error) in zip(self.be.all_true([d[0] for d in deferred]), deferred):
                if not ok:
                    self._record(error, detail, value)
        return self.errors

    def failed(self):
        """Whether a requirement failed so far this step (False while a graph is built: its assertions run
        later). Eagerly this reads the truths recorded so far (settled_errors)."""
        return bool(self.settled_errors())

    def guarded(self, x):
        """x, once every assertion recorded so far has passed (a graph); x itself eagerly."""
        return self.be.after(self.guards, x) if self.guards else x

    def pending(self):
        """What the step's outputs must wait for in a graph: its assertions and the host op that adds its runtime
        byte counts (empty eagerly)."""
        counted = self._runtime_counted()
        return self.guards + ([counted] if counted is not None else [])

    # ------------------------------------------------------------------------------------------ accounting
    def timed(self, field):
        """A context that adds the seconds it lasts to statistics field `field` (nothing where not measured)."""
        return self.timer(self.stats, field) if self.timer is not None else contextlib.nullcontext()

    def count(self, **amounts):
        """Bytes (or elements) known when the step is made: the same every step."""
        _add(self.per_step if self.built_steps else self.stats.current, amounts)

    def count_decided(self, **amounts):
        """Bytes known once a host decision is taken, called from that decision (which runs with the step)."""
        if self.built_steps:
            self.decided_last = dict(amounts)
            _add(self.decided_total, amounts)
        else:
            self.stats.add(**amounts)

    def count_runtime(self, **amounts):
        """Bytes known only as the step runs (numbers, or tensors of them in a graph)."""
        if self.be.building_graph():
            self.runtime.extend(amounts.items())
            return
        amounts = {key: float(value) for key, value in amounts.items()}
        if self.built_steps:
            _add(self.runtime_last, amounts)
            _add(self.runtime_total, amounts)
        else:
            self.stats.add(**amounts)

    def _runtime_counted(self):
        """In a graph: one host op that adds the step's runtime byte counts, or None."""
        if not self.runtime:
            return None
        fields = sorted({key for key, _ in self.runtime})
        values = [self.be.stack([v for key, v in self.runtime if key == field], "float64") for field in fields]

        def add(*per_field):
            self.runtime_last = {}
            amounts = {field: float(sum(v)) for field, v in zip(fields, per_field)}
            _add(self.runtime_last, amounts)
            _add(self.runtime_total, amounts)
            return 0

        return self.be.host(add, values, ("int32",))[0]

    def totals(self, steps, fields):
        """built_steps: (the last step's, and the `steps` steps' total) of each counted field."""
        last = {k: self.per_step.get(k, 0) + self.decided_last.get(k, 0) + self.runtime_last.get(k, 0)
                for k in fields}
        total = {k: self.per_step.get(k, 0) * steps + self.decided_total.get(k, 0) + self.runtime_total.get(k, 0)
                 for k in fields}
        return last, total
