"""DiLoCoOptimizer for Keras 3 optimizers: H local steps of the wrapped optimizer, then an outer Nesterov step on
the ranks' averaged pseudo-gradients, sent through any compressor of the plan (horovod_ext/consensus/diloco.py has
the math; horovod_ext/torch/diloco.py is the PyTorch adapter, with the same names and semantics).

    opt = hvd.DiLoCoOptimizer(keras.optimizers.AdamW(4e-4), inner_steps=50,
                              compression=hvd.Compression.ternary(error_feedback=True))
    model.compile(optimizer=opt, loss=...); model.fit(...)      # or opt.apply_gradients in a custom loop
    with opt.evaluation_parameters():                           # the outer parameters
        model.evaluate(...)

apply() (which model.fit and apply_gradients call) runs the inner step, the wrapped optimizer's on this rank's own
gradients, and counts it; every inner_steps-th, the round: Delta_m = theta - theta_m through the plan (a
GradientAggregator whose step counter is the round counter: its codecs, seeds, error-feedback residuals and byte
counts), then consensus.diloco.outer_update (the reference's float32 rounding order), and every rank continues
from theta. Eagerly the round is a Python ``if``; inside tf.function a tf.cond on the inner step counter (every
rank takes the same branch, so the collectives in it match). At the first step the outer parameters become rank
0's (one broadcast). With ``groups``, a worker's ranks average their gradients before the inner step (a second
aggregator, over the worker's process set, through ``inner_compression``) and only its first rank sends at a
round, then broadcasts the average to its group (consensus/diloco.py). State: ``optimizer.horovod_ext``, a
tf.Module (outer parameters and momentum, the inner step counter, the aggregators' steps, seeds and residuals):
``tf.train.Checkpoint(model=..., optimizer=..., horovod_ext=optimizer.horovod_ext)``.
"""
import contextlib
import functools
import itertools
import warnings

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.functions import broadcast_object

from horovod_ext.compression import CompressionStats
from horovod_ext.compression.consistency import allgather_blobs
from horovod_ext.compression.horovod_args import outside_process_set
from horovod_ext.compression.specs import describe_compression
from horovod_ext.compression.wire import allreduce_wire_bytes
from horovod_ext.consensus.agreement import build_on_every_rank
from horovod_ext.consensus import diloco_accounting as accounting
from horovod_ext.consensus.diloco import (NO_COMPRESSION, DiLoCoSettings, averaged_pseudo_gradient, elected,
                                          fragments_of, leader_transport, merged, outer_update, worker_process_sets)
from .optimizer import GradientAggregator, variable_names
from .backend import barrier_over_every_rank, numpy_allgather
from .elastic_state import assign_all, broadcast_variables, numpy_values
from .wrapping import checked_named_tensors, wrap

WHAT = "DiLoCoOptimizer"
_ids = itertools.count()
_DENSE_FIELDS = ("payload_bytes", "dense_bytes", "wire_bytes", "dense_wire_bytes", "elements", "compressed_elements")


def _described(compression):
    """A compression argument as the ranks compare it (as PyTorch's adapter does)."""
    return describe_compression(compression if compression is not None else hvd.Compression.none)


def _grouped(result):
    return tf.no_op() if result is None else tf.group(result)


@tf.autograph.experimental.do_not_convert
def _when(truth, fn, otherwise):
    """fn() if truth else otherwise(): a Python if eagerly, a tf.cond in a graph (each gives an op or None)."""
    if tf.executing_eagerly():
        return fn() if bool(truth) else otherwise()
    return tf.cond(truth, lambda: _grouped(fn()), lambda: _grouped(otherwise()))


@tf.autograph.experimental.do_not_convert
def _switch(index, fns):
    """fns[index](): a Python call eagerly, a tf.switch_case in a graph (each gives an op or None)."""
    if tf.executing_eagerly():
        return fns[int(index)]()
    if len(fns) == 1:
        return fns[0]()
    return tf.switch_case(tf.cast(index, tf.int32), [lambda fn=fn: _grouped(fn()) for fn in fns])


@tf.autograph.experimental.do_not_convert
def _pick(truth, fn, otherwise):
    """fn() if truth else otherwise(), as a tensor: a Python if eagerly (truth a bool or a tensor), a tf.cond in a
    graph."""
    if tf.executing_eagerly():
        return fn() if bool(truth) else otherwise()
    return tf.cond(truth, fn, otherwise)


def _packed(payloads):
    """One uint8 buffer: the payloads' byte counts (int64), then their bytes."""
    raw = [tf.reshape(p if p.dtype == tf.uint8 else tf.bitcast(p, tf.uint8), [-1]) for p in payloads]
    sizes = tf.stack([tf.size(r, out_type=tf.int64) for r in raw])
    return tf.concat([tf.reshape(tf.bitcast(sizes, tf.uint8), [-1]), *raw], 0)


def _unpacked(buffer, count):
    """The `count` payloads of a _packed buffer, as uint8."""
    sizes = tf.bitcast(tf.reshape(buffer[:8 * count], [count, 8]), tf.int64)
    return tf.split(buffer[8 * count:], sizes, num=count)


def _as(chunk, dtype):
    """A uint8 chunk's bytes as `dtype`."""
    size = tf.as_dtype(dtype).size
    return chunk if dtype == tf.uint8 else tf.bitcast(tf.reshape(chunk, [-1, size]), dtype)


class _Bound:
    """The model's variables the state is built for (not tracked: they are the model's, not horovod_ext's)."""

    def __init__(self, variables):
        self.variables = list(variables)


class DiLoCoState(tf.Module):
    """DiLoCo's state in tf.Variables, for tf.train.Checkpoint and the step's graph: ``inner`` (inner steps taken),
    ``started`` (the outer parameters were taken from rank 0), ``outer`` and ``momentum`` (float32, shaped as the
    model's variables, made at build), ``fragment_started`` (per fragment: its first round is behind it, so its
    momentum is set), ``rounds`` (fragment exchanges applied), ``update_norm`` (|theta_new - theta| of the last
    round), ``pending`` (per variable: the averaged pseudo-gradient of the fragment whose outer update is due,
    ``pending_fragment``, -1 when none) and ``exchanges``, one GradientAggregator per fragment that its
    pseudo-gradients travel through (its step counter is the fragment's round counter; its seed and error-feedback
    residuals).

    With ``overlap`` the exchange runs synchronously when the fragment's pseudo-gradient is taken (TensorFlow's
    Horovod ops give no handle to wait for in a later step) and its average waits in ``pending`` for the step the
    update is due: the same schedule, and the same bits, as PyTorch's, without hiding the exchange's time."""

    def __init__(self, make_workers, compression, inner_compression, n):
        super().__init__(name=f"horovod_ext_diloco_{n}")
        self.n, self._make_workers = n, make_workers
        settings, group_set, leaders_set = make_workers()
        with tf.init_scope():
            self.inner = tf.Variable(0, dtype=tf.int64, trainable=False, name="inner")
            self.started = tf.Variable(False, trainable=False, name="started")
            self.fragment_started = tf.Variable([False] * settings.fragments, trainable=False,
                                                name="fragment_started")
            self.rounds = tf.Variable(0, dtype=tf.int64, trainable=False, name="rounds")
            self.pending_fragment = tf.Variable(-1, dtype=tf.int64, trainable=False, name="pending_fragment")
            self.update_norm = tf.Variable(np.nan, dtype=tf.float64, trainable=False, name="update_norm")
            # outer="leader": this rank's training losses since the last election, the elected worker's leader
            # rank, whether the next election may meet ranks without a loss (after an elastic reset), the bytes
            # this rank sent as the elected worker and their wire bytes
            self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="loss_sum")
            self.loss_count = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="loss_count")
            self.elected = tf.Variable(-1, dtype=tf.int64, trainable=False, name="elected")
            self.lenient = tf.Variable(False, trainable=False, name="lenient")
            self.leader_bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="leader_bytes")
            self.leader_wire_bytes = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="leader_wire_bytes")
        self.outer, self.momentum, self.pending = [], [], []
        # across workers, over the leaders' process set (a rank that does not lead its worker never sends); one
        # per fragment
        self.exchanges = [GradientAggregator(compression, hvd.Average, leaders_set,
                                             name=f"horovod_ext_diloco_exchange_{n}" + (f"_f{f}" if f else ""))
                          for f in range(settings.fragments)]
        # with groups: inside this rank's worker, every inner step's gradients averaged over its process set
        self.inner_average = None if settings.groups_arg is None else GradientAggregator(
            inner_compression, hvd.Average, group_set or leaders_set, name=f"horovod_ext_diloco_inner_{n}")
        self._configure(settings, group_set, leaders_set)
        self._bound = None
        self.fragments = None  # the variables' indices per fragment, at build

    def _configure(self, settings, group_set, leaders_set):
        """The workers of the job's membership: the settings, and the aggregators' process sets."""
        self.settings, self.group_set = settings, group_set
        for exchange in self.exchanges:
            exchange.process_set, exchange.outside = leaders_set, outside_process_set(leaders_set)
        if self.inner_average is not None and group_set is not None:
            self.inner_average.process_set, self.inner_average.outside = group_set, outside_process_set(group_set)

    @property
    def averaging_in_group(self):
        """Whether this rank's worker has other ranks (their gradients are averaged at every inner step)."""
        return self.inner_average is not None and self.group_set is not None

    # ------------------------------------------------------------------------------------------------ build
    def build(self, variables):
        """The outer parameters and momentum for `variables` (eagerly, once; nothing collective, so that a rank
        added by elastic training builds before its sync): the aggregators agree on their settings at their first
        step."""
        variables = list(variables)
        if self._bound is not None:
            bound = self._bound.variables
            if len(bound) != len(variables) or any(a is not b for a, b in zip(bound, variables)):
                raise ValueError(f"{WHAT}: apply() was given other variables than the optimizer was built for "
                                 f"({len(variables)} against {len(bound)}); DiLoCo keeps outer parameters per "
                                 f"variable, so every step must update the same variables")
            return
        self.fragments = fragments_of(variable_names(variables), self.settings.fragments)
        with tf.init_scope():
            # added to the lists made in __init__, so that a checkpoint read before the build restores them
            for kind, into in (("outer", self.outer), ("momentum", self.momentum), ("pending", self.pending)):
                into.extend(tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False, name=f"{kind}_{i}")
                            for i, v in enumerate(variables))
            self._bound = _Bound(variables)

    @property
    def variables_bound(self):
        return self._bound.variables if self._bound is not None else []

    # ------------------------------------------------------------------------------------------------ a step
    @tf.autograph.experimental.do_not_convert
    def start(self):
        """At the first step: rank 0's parameters in the model and as the outer parameters (one broadcast each)."""
        def take_rank0():
            ops = []
            for i, (v, theta) in enumerate(zip(self.variables_bound, self.outer)):
                value = hvd.broadcast(tf.convert_to_tensor(v), root_rank=0, ignore_name_scope=True,
                                      name=f"horovod_ext.diloco.{self.n}.start.{i}")
                ops += [v.assign(value), theta.assign(tf.cast(value, tf.float32))]
            with tf.control_dependencies(ops):
                return self.started.assign(True)

        return _when(tf.logical_not(self.started.read_value()), take_rank0, lambda: None)

    @tf.autograph.experimental.do_not_convert
    def after_inner_step(self):
        """Count the inner step; where the schedule says (consensus.diloco.Schedule), a fragment's exchange and
        then the outer update that is due (fragments=1, overlap=0: every inner_steps-th step, the whole round)."""
        s = self.settings
        inner = self.inner.assign_add(1)
        starts, fragment = s.schedule.at(inner)
        exchanged = _when(starts, lambda: _switch(fragment, [functools.partial(self.exchange_fragment, f)
                                                             for f in range(s.fragments)]), lambda: None)
        with tf.control_dependencies([exchanged] if exchanged is not None else []):
            due, applied = s.schedule.at(inner - s.overlap)
            return _when(due, lambda: _switch(applied, [functools.partial(self.apply_fragment, f)
                                                        for f in range(s.fragments)]), lambda: None)

    def _variables_of(self, fragment):
        return [self.variables_bound[i] for i in self.fragments[fragment]]

    @tf.autograph.experimental.do_not_convert
    def exchange_fragment(self, fragment):
        """Delta_m = theta - theta_m over the fragment's variables, averaged over the workers through its exchange
        (the leaders, then each leader to its group), into ``pending``."""
        s, indices = self.settings, self.fragments[fragment]
        variables = self._variables_of(fragment)
        deltas = [self.outer[i].read_value() - tf.cast(self.variables_bound[i], tf.float32) for i in indices]

        def in_group(values):  # the leader's average to its worker's other ranks
            return [hvd.broadcast(value, root_rank=s.group[0], process_set=self.group_set, ignore_name_scope=True,
                                  name=f"horovod_ext.diloco.{self.n}.share.{s.generation}.{i}")
                    for i, value in zip(indices, values)]

        if s.outer == "leader":
            best, joined = self.elect()
            across = lambda values: self.leader_exchange(fragment, values, variables, best, joined)  # noqa: E731
        else:
            across = lambda values: self.exchanges[fragment].aggregate(values, variables)  # noqa: E731
        delta = averaged_pseudo_gradient(s, deltas, across, in_group)
        ops = [self.pending[i].assign(d) for i, d in zip(indices, delta)]
        with tf.control_dependencies(ops):
            return self.pending_fragment.assign(fragment)

    # ------------------------------------------------------------------------------------ outer="leader"
    def report_loss(self, loss):
        """Add a training loss (a number or a scalar tensor) to the window the best worker is elected by."""
        loss = tf.cast(tf.reshape(loss, []), tf.float64) if tf.is_tensor(loss) else tf.constant(float(loss), tf.float64)
        return tf.group(self.loss_sum.assign_add(loss), self.loss_count.assign_add(1.0))

    @tf.autograph.experimental.do_not_convert
    def elect(self):
        """Every rank's (loss sum, count) since the last election by one small allreduce, and the same worker
        elected on every rank (consensus.diloco.elected, on the host inside a graph); the window starts again.
        Returns (the worker's index, whether some rank has joined): Python values eagerly; in a graph the index as
        an int64 tensor and False (Horovod 0.28.1's TensorFlow join fails inside tf.function by itself)."""
        s = self.settings
        row = tf.reshape(tf.stack([self.loss_sum.read_value(), self.loss_count.read_value(),
                                   tf.constant(1.0, tf.float64)]), [1, 3])
        mask = tf.reshape(tf.one_hot(hvd.rank(), hvd.size(), dtype=tf.float64), [hvd.size(), 1])
        table = hvd.allreduce(mask * row, op=hvd.Sum, ignore_name_scope=True,
                              name=f"horovod_ext.diloco.{self.n}.losses.{s.generation}")
        if tf.executing_eagerly():
            best, joined = elected(table.numpy().tolist(), s.workers, WHAT, lenient=bool(self.lenient.numpy()))
        else:
            best, joined = tf.reshape(tf.py_function(lambda t, le: np.int64(elected(
                t.numpy().tolist(), s.workers, WHAT, lenient=bool(le.numpy()))[0]),
                [table, self.lenient.read_value()], tf.int64), []), False
        leaders = tf.constant(s.leaders, tf.int64)
        with tf.control_dependencies([self.loss_sum.assign(0.0), self.loss_count.assign(0.0),
                                      self.lenient.assign(False), self.elected.assign(tf.gather(leaders, best))]):
            return (best, joined) if tf.executing_eagerly() else (tf.identity(best), joined)

    @tf.autograph.experimental.do_not_convert
    def leader_exchange(self, fragment, values, variables, best, joined):
        """The elected worker's pseudo-gradient on every leader through the fragment's plan
        (consensus.diloco.leader_transport): the elected leader encodes each tensor (with its error feedback) into
        one buffer, one allgather over the leaders to which every other leader contributes nothing carries it, and
        every leader decodes it (one collective: see horovod_ext/torch/diloco.py's _hx_leader_launch); while a rank
        has joined, the float32 values by one allreduce (Sum) with the other leaders' zeros."""
        s, aggregator = self.settings, self.exchanges[fragment]
        names = variable_names(variables)
        aggregator._agree(names, values)  # noqa: SLF001 - the plan's settings exchange (eager, also while tracing)
        driver, be = aggregator.run.driver, aggregator.backend
        driver.begin(aggregator.step.read_value(), aggregator.seed.read_value())
        kind, codec = leader_transport(driver.method, joined)
        sending = tf.equal(tf.cast(best, tf.int64), s.workers.index(s.group))
        items = [driver.item(i, name, d, d.shape.num_elements(), 4) for i, (name, d) in enumerate(zip(names, values))]
        name = f"horovod_ext.diloco.{self.n}.leader.{s.generation}.{names[0]}"
        if kind == "dense":
            flat = tf.concat([be.flat32(d) for d in values], 0)
            buffer = _pick(sending, lambda: flat, lambda: tf.zeros_like(flat))
            summed = hvd.allreduce(buffer, op=hvd.Sum, process_set=aggregator.process_set, ignore_name_scope=True,
                                   name=name)
            out = [tf.reshape(v, d.shape) for v, d in zip(tf.split(summed, [item.numel for item in items]), values)]
            sent = tf.size(buffer, out_type=tf.int64) * 4
        else:
            def encoded():
                if kind == "codec":
                    return _packed([codec.encode(be, item, codec.prepare(be, item, be.flat32(d)))[0]
                                    for item, d in zip(items, values)])
                return _packed([codec.compress(be.flat32(d))[0] for d in values])

            buffer = _pick(sending, encoded, lambda: tf.zeros([0], tf.uint8))
            gathered = hvd.allgather(buffer, process_set=aggregator.process_set, ignore_name_scope=True, name=name)
            out = []
            for item, d, chunk in zip(items, values, _unpacked(gathered, len(items))):
                if kind == "codec":
                    value = codec.sent(be, item, chunk)
                else:
                    compressed, ctx = codec.compress(be.flat32(d)[:1])  # the compressed dtype and the context
                    value = codec.decompress(_as(chunk, compressed.dtype), ctx)
                out.append(tf.reshape(tf.cast(value, tf.float32), d.shape))
            sent = tf.size(buffer, out_type=tf.int64)
        sent = tf.where(sending, sent, tf.zeros_like(sent))
        wire = tf.cast(sent, tf.float64) * accounting.transfer_wire_per_byte(kind, len(s.leaders))
        with tf.control_dependencies(out):
            counted = [aggregator.step.assign_add(1), self.leader_bytes.assign_add(sent),
                       self.leader_wire_bytes.assign_add(wire)]
        with tf.control_dependencies(counted):
            return [tf.identity(o) for o in out]

    @tf.autograph.experimental.do_not_convert
    def apply_fragment(self, fragment):
        """The outer step on the fragment's outer parameters and momentum from ``pending``, and the worker's
        fragment merged with the new outer one (merge_alpha; 0: theta_m = theta)."""
        s, indices = self.settings, self.fragments[fragment]
        outer = [self.outer[i].read_value() for i in indices]
        delta = [self.pending[i].read_value() for i in indices]

        def update(momentum):
            return outer_update(outer, momentum, delta, s.outer_lr, s.outer_momentum, s.nesterov)

        momentum = [self.momentum[i].read_value() for i in indices]
        first = tf.logical_not(self.fragment_started[fragment])
        if tf.executing_eagerly():
            new_outer, new_momentum = update(None if bool(first) else momentum)
        else:
            n = len(outer)
            both = tf.cond(first, lambda: sum(update(None), []), lambda: sum(update(momentum), []))
            new_outer, new_momentum = list(both[:n]), list(both[n:])
        squares = [tf.reduce_sum(tf.cast(tf.square(new - old), tf.float64)) for new, old in zip(new_outer, outer)]
        ops = [self.update_norm.assign(tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0, tf.float64)),
               self.fragment_started[fragment].assign(True), self.pending_fragment.assign(-1),
               self.rounds.assign_add(1)]
        for i, new, new_b in zip(indices, new_outer, new_momentum):
            v = self.variables_bound[i]
            ops += [self.outer[i].assign(new), self.momentum[i].assign(new_b),
                    v.assign(tf.cast(merged(tf.cast(v, tf.float32), new, s.merge_alpha), v.dtype))]
        return tf.group(*ops)

    # -------------------------------------------------------------------------------------------- observability
    def compression_stats(self):
        """As PyTorch's: the bytes this rank put on the wire (``total``: the start's broadcast, the rounds' bytes,
        the exchange's on a worker's leader, with groups the averages inside this rank's worker;
        consensus.diloco_accounting.report) against data-parallel SGD's dense allreduce of the gradients over all
        ranks at every step (horovod_ext.consensus.accounting's reference); the parts apart (``exchange``,
        ``start``, with groups ``inner``: every step's gradients and the leader's broadcast of each round's
        average)."""
        exchanges = [exchange.compression_stats() for exchange in self.exchanges]
        sent = [e.pop("steps") for e in exchanges]  # per fragment: the exchanges this rank sent
        stats, s = exchanges[0], self.settings
        peak = max((e["total"]["payload_bytes"] / n for e, n in zip(exchanges, sent) if n), default=0)
        inner, rounds = int(self.inner.numpy()), int(self.rounds.numpy())
        fragments = self.fragments or [list(range(len(self.variables_bound)))]

        def dense_of(indices):  # data-parallel SGD's allreduce of these variables' gradients
            variables = [self.variables_bound[i] for i in indices]
            nbytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)
            return {"elements": sum(int(np.prod(v.shape)) for v in variables), "dense_bytes": nbytes,
                    "dense_wire_bytes": allreduce_wire_bytes(nbytes, hvd.size())}

        dense, dense_f = dense_of(range(len(self.variables_bound))), [dense_of(f) for f in fragments]
        # the plan counted the dense reference of the tensors it sent; every other tensor at every step, here
        total = {k: sum(e["total"][k] for e in exchanges) + inner * dense.get(k, 0)
                 - sum(n * d.get(k, 0) for n, d in zip(sent, dense_f)) for k in _DENSE_FIELDS}
        seconds = {k: 0.0 for k in ("compress_seconds", "decompress_seconds", "comm_seconds")}
        if s.outer == "leader":  # the bytes this rank sent when elected, and the elections' allreduces
            rounds_started = int(self.rounds.numpy()) + (int(self.pending_fragment.numpy()) >= 0 and s.overlap > 0)
            election = accounting.election_counts(hvd.size())
            total["payload_bytes"] += int(self.leader_bytes.numpy()) + rounds_started * election["payload_bytes"]
            total["wire_bytes"] += float(self.leader_wire_bytes.numpy()) + rounds_started * election["wire_bytes"]
        stats["total"] = CompressionStats._summary({**total, **seconds})  # noqa: SLF001
        last = s.schedule.starts(inner) if s.is_leader else None
        last_step = {k: dense.get(k, 0) for k in _DENSE_FIELDS}
        if last is not None:  # the last step sent a fragment: what the plan counted for it, the rest dense
            last_step = {k: exchanges[last]["last_step"][k] + dense.get(k, 0) - dense_f[last].get(k, 0)
                         for k in _DENSE_FIELDS}
        stats["last_step"] = CompressionStats._summary({**last_step, **seconds})  # noqa: SLF001
        norm, pending = float(self.update_norm.numpy()), int(self.pending_fragment.numpy())
        names = variable_names(self.variables_bound)
        stats.update(optimizer=WHAT, ranks=hvd.size(), steps=inner, inner_steps=s.inner_steps,
                     inner_steps_taken=inner, outer_rounds=rounds, outer_update_norm=None if np.isnan(norm) else norm,
                     workers=s.workers, leader=s.is_leader, fragments=[[names[i] for i in f] for f in fragments],
                     overlap=s.overlap, merge_alpha=s.merge_alpha, peak_exchange_payload_bytes=peak,
                     in_flight=None if pending < 0 or s.overlap == 0 else pending, outer=s.outer,
                     elected=None if int(self.elected.numpy()) < 0 else int(self.elected.numpy()))
        start = accounting.start_counts(dense["dense_bytes"], hvd.size(), hvd.rank()) \
            if bool(self.started.numpy()) else accounting.counts(0, 0)
        group = share = None
        if self.averaging_in_group:
            group = self.inner_average.compression_stats()
            group["total"] = CompressionStats._summary(  # noqa: SLF001
                {**{k: group["total"][k] for k in _DENSE_FIELDS}, **seconds})
            share = accounting.share_counts(s, [4 * d["elements"] for d in dense_f],
                                            accounting.exchanges_started(s.schedule, inner))
        return accounting.report(stats, hvd.size(), start, group, share)

    @contextlib.contextmanager
    def evaluation_parameters(self):
        """Inside the block the model holds the outer parameters (the same on every rank), its own after."""
        if not self.variables_bound or not bool(self.started.numpy()):
            yield
            return
        own = [tf.identity(v) for v in self.variables_bound]
        for v, theta in zip(self.variables_bound, self.outer):
            v.assign(tf.cast(theta, v.dtype))
        try:
            yield
        finally:
            for v, value in zip(self.variables_bound, own):
                v.assign(value)

    # -------------------------------------------------------------------------------------- elastic training
    def _values(self):
        return [self.inner, self.started, self.fragment_started, self.rounds, self.pending_fragment,
                self.update_norm, self.elected, self.leader_bytes, self.leader_wire_bytes, *self.outer, *self.momentum,
                *self.pending]

    def _aggregators(self):
        return [a for a in (*self.exchanges, self.inner_average) if a is not None]

    def elastic_commit(self):
        """This rank's state at a commit (keras/elastic.py's KerasState): the inner step count, the outer parameters
        and momentum, and each aggregator's (round counter, seed, method state, this rank's residuals)."""
        return {"values": numpy_values(self._values()),
                "aggregators": [a.elastic_commit() for a in self._aggregators()]}

    def elastic_restore(self, saved):
        assign_all(self._values(), saved["values"])
        for aggregator, state in zip(self._aggregators(), saved["aggregators"]):
            aggregator.elastic_restore(state)

    def elastic_reset(self):
        """After Horovod's elastic reset: the workers of the new membership (collective: the settings checked on
        every rank, the groups made into process sets again) and the aggregators built again for them at the next
        trace, each rank's residuals carried over; the outer state comes from the commit, then from rank 0."""
        with tf.init_scope():
            self._configure(*self._make_workers())
            self.lenient.assign(True)
            for aggregator in self._aggregators():
                aggregator.elastic_reset()

    def elastic_sync(self):
        """Rank 0's inner step count, outer parameters and momentum, and its aggregators' shared state, on every
        rank (an added rank builds its variables first: KerasState builds the optimizer before the sync)."""
        with tf.init_scope():
            broadcast_variables(self._values(), f"diloco.{self.n}")
            for aggregator in self._aggregators():
                aggregator.elastic_sync()

    # -------------------------------------------------------------------------------------------- checkpoints
    def broadcast_state(self, root_rank=0):
        """Horovod's resume idiom (root_rank restored a checkpoint and broadcasts the model's and the optimizer's
        variables): root_rank's inner step counter, outer parameters and momentum and the exchange's round counter,
        seed and method state on every rank; the residuals stay each rank's own. Eager, collective, once the
        optimizer is built on every rank (``optimizer.build(model.trainable_variables)``)."""
        if self._bound is None:
            raise RuntimeError(f"{WHAT}: broadcast_state() needs the optimizer built on every rank first: call "
                               f"optimizer.build(model.trainable_variables) on every rank before it")
        aggregators = self._aggregators()
        shared = [*self._values(), *[v for a in aggregators for v in (a.step, a.seed)]]
        for i, v in enumerate(shared):
            v.assign(hvd.broadcast(tf.convert_to_tensor(v), root_rank=root_rank, ignore_name_scope=True,
                                   name=f"horovod_ext.diloco.{self.n}.state.{i}"))
        for k, aggregator in enumerate(aggregators):
            aggregator.method_state.assign(broadcast_object(
                aggregator.method_state.numpy().decode(), root_rank=root_rank,
                name=f"horovod_ext.diloco.{self.n}.method_state.{k}"))
            aggregator.run.counters.chosen = True  # the broadcast seed is the run's


def DiLoCoOptimizer(optimizer, named_parameters=None, inner_steps=50, outer_lr=0.7, outer_momentum=0.9,
                    nesterov=True, compression=None, groups=None, inner_compression=None, fragments=1, overlap=0,
                    merge_alpha=0.0, outer="average"):
    """DiLoCo (Douillard et al. 2023) for a Keras 3 optimizer (the inner one, AdamW in the paper): see
    horovod_ext.torch.DiLoCoOptimizer; the same arguments and semantics.

    Every rank takes ``inner_steps`` steps of its own optimizer on its own gradients; then the ranks average their
    pseudo-gradients (outer parameters minus their own) through ``compression`` (any of hvd.Compression's; error
    feedback keeps what a compressor drops for the next round) and an outer SGD step with Nesterov momentum moves
    the outer parameters: b = mu b + Delta, theta -= outer_lr (Delta + mu b); every rank continues from theta.
    named_parameters (optional): (name, variable) pairs, checked across ranks. Construction is collective: bad or
    differing arguments raise the same error on every rank. ``groups`` (None, "node" or rank lists) and
    ``inner_compression``: workers of several ranks, as in PyTorch (process sets: initialize with
    horovod_ext.tensorflow.keras.init(), which enables dynamic process sets).

    Streaming DiLoCo: ``fragments``, ``overlap`` and ``merge_alpha`` as in PyTorch, to the same bits; with
    ``overlap`` the exchange itself runs synchronously when the fragment's pseudo-gradient is taken (a warning says
    so) and its average is applied ``overlap`` steps later. ``outer="leader"``: as in PyTorch; the loss comes from
    ``optimizer.report_loss(loss)`` in a custom loop or ``hvd.callbacks.ReportLossCallback()`` with model.fit."""
    named, tensors = checked_named_tensors(optimizer, named_parameters, WHAT)
    arguments = {"inner_steps": inner_steps, "outer_lr": outer_lr, "outer_momentum": outer_momentum,
                 "nesterov": nesterov, "fragments": fragments, "overlap": overlap, "merge_alpha": merge_alpha,
                 "outer": outer}
    n = next(_ids)
    with tf.init_scope():
        gather = functools.partial(allgather_blobs, allgather=numpy_allgather(), tag=f"hvdext.{WHAT}.{n}")
        compared = dict(arguments, groups=groups, inner_compression=_described(inner_compression))
        inner_compressed = _described(inner_compression) != NO_COMPRESSION

        def make_workers():
            """(settings, this rank's worker's process set, the leaders') for the job's membership, on every rank."""
            settings = build_on_every_rank(
                lambda: DiLoCoSettings(size=hvd.size(), groups=groups, inner_compressed=inner_compressed,
                                       compression=compression, **arguments),
                compared, tensors, gather, hvd.rank(), hvd.size(), WHAT)
            return (settings, *worker_process_sets(settings, hvd.size(), hvd.add_process_set,
                                                   barrier_over_every_rank))

        none = hvd.Compression.none
        if overlap and not isinstance(overlap, bool) and isinstance(overlap, int) and overlap > 0:
            warnings.warn(f"{WHAT} (TensorFlow): overlap={overlap} applies each fragment's outer update {overlap} "
                          f"inner step(s) after its pseudo-gradient is taken, as in PyTorch and to the same bits, but "
                          f"the exchange runs synchronously at its start: TensorFlow's Horovod ops give no handle to "
                          f"wait for later, so its time is not hidden behind the inner steps", stacklevel=2)
        state = DiLoCoState(make_workers, compression if compression is not None else none,
                            inner_compression if inner_compression is not None else none, n)
    base = optimizer.__class__

    def build(self, var_list):
        base.build(self, var_list)
        self.horovod_ext.build(var_list)

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables) if trainable_variables is not None else list(self._trainable_variables)
        state = self.horovod_ext
        state.build(variables)
        with tf.control_dependencies([s for s in [state.start()] if s is not None]):
            if state.averaging_in_group:  # a worker of several ranks: the average of their gradients
                grads = state.inner_average.aggregate(list(grads), variables)
            base.apply(self, grads, variables)  # the inner step, on this worker's gradients
        state.after_inner_step()

    def evaluation_parameters(self):
        """Context manager: the model holds the outer parameters inside the block, its own after."""
        return self.horovod_ext.evaluation_parameters()

    def compression_stats(self):
        return self.horovod_ext.compression_stats()

    def report_loss(self, loss):
        """outer="leader": add a training loss to the window the best worker is elected by."""
        return self.horovod_ext.report_loss(loss)

    return wrap(optimizer, {"build": build, "apply": apply, "evaluation_parameters": evaluation_parameters,
                            "compression_stats": compression_stats, "report_loss": report_loss}, state)
