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
from horovod_ext.consensus.diloco import (NO_COMPRESSION, DiLoCoSettings, averaged_pseudo_gradient, outer_update,
                                          worker_process_sets)
from .aggregator import GradientAggregator, variable_names
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


class _Bound:
    """The model's variables the state is built for (not tracked: they are the model's, not horovod_ext's)."""

    def __init__(self, variables):
        self.variables = list(variables)


class DiLoCoState(tf.Module):
    """DiLoCo's state in tf.Variables, for tf.train.Checkpoint and the step's graph: ``inner`` (inner steps taken),
    ``started`` (the outer parameters were taken from rank 0), ``outer`` and ``momentum`` (float32, shaped as the
    model's variables, made at build), ``has_momentum`` (after the first round), ``update_norm`` (|theta_new -
    theta| of the last round), and ``exchange``, the GradientAggregator the pseudo-gradients travel through (its
    step counter is the round counter; its seed and error-feedback residuals)."""

    def __init__(self, make_workers, compression, inner_compression, n):
        super().__init__(name=f"horovod_ext_diloco_{n}")
        self.n, self._make_workers = n, make_workers
        settings, group_set, leaders_set = make_workers()
        with tf.init_scope():
            self.inner = tf.Variable(0, dtype=tf.int64, trainable=False, name="inner")
            self.started = tf.Variable(False, trainable=False, name="started")
            self.has_momentum = tf.Variable(False, trainable=False, name="has_momentum")
            self.update_norm = tf.Variable(np.nan, dtype=tf.float64, trainable=False, name="update_norm")
        self.outer, self.momentum = [], []
        # across workers, over the leaders' process set (a rank that does not lead its worker never sends)
        self.exchange = GradientAggregator(compression, hvd.Average, leaders_set,
                                           name=f"horovod_ext_diloco_exchange_{n}")
        # with groups: inside this rank's worker, every inner step's gradients averaged over its process set
        self.inner_average = None if settings.groups_arg is None else GradientAggregator(
            inner_compression, hvd.Average, group_set or leaders_set, name=f"horovod_ext_diloco_inner_{n}")
        self._configure(settings, group_set, leaders_set)
        self._bound = None

    def _configure(self, settings, group_set, leaders_set):
        """The workers of the job's membership: the settings, and the aggregators' process sets."""
        self.settings, self.group_set = settings, group_set
        self.exchange.process_set, self.exchange.outside = leaders_set, outside_process_set(leaders_set)
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
        with tf.init_scope():
            # added to the lists made in __init__, so that a checkpoint read before the build restores them
            self.outer.extend(tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False, name=f"outer_{i}")
                              for i, v in enumerate(variables))
            self.momentum.extend(tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False, name=f"momentum_{i}")
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
        """Count the inner step; every inner_steps-th, the outer round."""
        inner = self.inner.assign_add(1)
        return _when(tf.equal(inner % self.settings.inner_steps, 0), self.outer_round, lambda: None)

    @tf.autograph.experimental.do_not_convert
    def outer_round(self):
        """Delta_m = theta - theta_m through the plan, then the outer step; every rank continues from theta."""
        s, variables = self.settings, self.variables_bound
        outer = [theta.read_value() for theta in self.outer]
        deltas = [theta - tf.cast(v, tf.float32) for theta, v in zip(outer, variables)]

        def in_group(values):  # the leader's average to its worker's other ranks
            return [hvd.broadcast(value, root_rank=s.group[0], process_set=self.group_set, ignore_name_scope=True,
                                  name=f"horovod_ext.diloco.{self.n}.share.{s.generation}.{i}")
                    for i, value in enumerate(values)]

        delta = averaged_pseudo_gradient(s, deltas, lambda values: self.exchange.aggregate(values, variables),
                                         in_group)

        def update(momentum):
            return outer_update(outer, momentum, delta, s.outer_lr, s.outer_momentum, s.nesterov)

        momentum = [b.read_value() for b in self.momentum]
        if tf.executing_eagerly():
            new_outer, new_momentum = update(momentum if bool(self.has_momentum.numpy()) else None)
        else:
            n = len(outer)
            both = tf.cond(self.has_momentum.read_value(), lambda: sum(update(momentum), []),
                           lambda: sum(update(None), []))
            new_outer, new_momentum = list(both[:n]), list(both[n:])
        squares = [tf.reduce_sum(tf.cast(tf.square(new - old), tf.float64)) for new, old in zip(new_outer, outer)]
        ops = [self.update_norm.assign(tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0, tf.float64)),
               self.has_momentum.assign(True)]
        for theta, b, v, new, new_b in zip(self.outer, self.momentum, variables, new_outer, new_momentum):
            ops += [theta.assign(new), b.assign(new_b), v.assign(tf.cast(new, v.dtype))]
        return tf.group(*ops)

    # -------------------------------------------------------------------------------------------- observability
    def compression_stats(self):
        """The rounds' bytes (the exchange's, on a worker's leader) plus, for every inner step the exchange did not
        count, data-parallel SGD's dense allreduce of the gradients over all ranks (horovod_ext.consensus.
        accounting's reference), as in PyTorch; with groups, ``inner``: the average inside this rank's worker
        (every step's gradients, and the leader's broadcast of each round's average)."""
        stats = self.exchange.compression_stats()
        inner, sent_rounds = int(self.inner.numpy()), stats.pop("steps")
        rounds = inner // self.settings.inner_steps
        numel = sum(int(np.prod(v.shape)) for v in self.variables_bound)
        nbytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in self.variables_bound)
        dense = {"elements": numel, "dense_bytes": nbytes, "dense_wire_bytes": allreduce_wire_bytes(nbytes, hvd.size())}
        total = {k: stats["total"][k] + (inner - sent_rounds) * dense.get(k, 0) for k in _DENSE_FIELDS}
        seconds = {k: 0.0 for k in ("compress_seconds", "decompress_seconds", "comm_seconds")}
        stats["total"] = CompressionStats._summary({**total, **seconds})  # noqa: SLF001
        if inner and (inner % self.settings.inner_steps or not self.settings.is_leader):
            # the last step sent nothing across workers
            stats["last_step"] = CompressionStats._summary({**{k: dense.get(k, 0) for k in _DENSE_FIELDS},  # noqa
                                                            **seconds})
        norm = float(self.update_norm.numpy())
        stats.update(optimizer=WHAT, ranks=hvd.size(), steps=inner, inner_steps=self.settings.inner_steps,
                     inner_steps_taken=inner, outer_rounds=rounds, outer_update_norm=None if np.isnan(norm) else norm,
                     workers=self.settings.workers, leader=self.settings.is_leader)
        if self.averaging_in_group:
            group = self.inner_average.compression_stats()
            shared = rounds * 4 * numel if self.settings.is_leader else 0  # the float32 averages broadcast
            group["total"] = CompressionStats._summary(  # noqa: SLF001
                {**{k: group["total"][k] for k in _DENSE_FIELDS}, **seconds,
                 "payload_bytes": group["total"]["payload_bytes"] + shared})
            stats["inner"] = group
        return stats

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
        return [self.inner, self.started, self.has_momentum, self.update_norm, *self.outer, *self.momentum]

    def _aggregators(self):
        return [a for a in (self.exchange, self.inner_average) if a is not None]

    def elastic_commit(self):
        """This rank's state at a commit (keras/elastic.py's KerasState): the inner step count, the outer parameters
        and momentum, and each aggregator's (round counter, seed, method state, this rank's residuals)."""
        return {"values": numpy_values(self._values()), "aggregators": [a.elastic_commit() for a in self._aggregators()]}

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
                    nesterov=True, compression=None, groups=None, inner_compression=None):
    """DiLoCo (Douillard et al. 2023) for a Keras 3 optimizer (the inner one, AdamW in the paper): see
    horovod_ext.torch.DiLoCoOptimizer; the same arguments and semantics.

    Every rank takes ``inner_steps`` steps of its own optimizer on its own gradients; then the ranks average their
    pseudo-gradients (outer parameters minus their own) through ``compression`` (any of hvd.Compression's; error
    feedback keeps what a compressor drops for the next round) and an outer SGD step with Nesterov momentum moves
    the outer parameters: b = mu b + Delta, theta -= outer_lr (Delta + mu b); every rank continues from theta.
    named_parameters (optional): (name, variable) pairs, checked across ranks. Construction is collective: bad or
    differing arguments raise the same error on every rank. ``groups`` (None, "node" or rank lists) and
    ``inner_compression``: workers of several ranks, as in PyTorch (process sets: initialize with
    horovod_ext.tensorflow.keras.init(), which enables dynamic process sets)."""
    named, tensors = checked_named_tensors(optimizer, named_parameters, WHAT)
    arguments = {"inner_steps": inner_steps, "outer_lr": outer_lr, "outer_momentum": outer_momentum,
                 "nesterov": nesterov}
    n = next(_ids)
    with tf.init_scope():
        gather = functools.partial(allgather_blobs, allgather=numpy_allgather(), tag=f"hvdext.{WHAT}.{n}")
        compared = dict(arguments, groups=groups, inner_compression=_described(inner_compression))
        inner_compressed = _described(inner_compression) != NO_COMPRESSION

        def make_workers():
            """(settings, this rank's worker's process set, the leaders') for the job's membership, on every rank."""
            settings = build_on_every_rank(
                lambda: DiLoCoSettings(size=hvd.size(), groups=groups, inner_compressed=inner_compressed, **arguments),
                compared, tensors, gather, hvd.rank(), hvd.size(), WHAT)
            return (settings, *worker_process_sets(settings, hvd.size(), hvd.add_process_set,
                                                   barrier_over_every_rank))

        none = hvd.Compression.none
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

    return wrap(optimizer, {"build": build, "apply": apply, "evaluation_parameters": evaluation_parameters,
                            "compression_stats": compression_stats}, state)
