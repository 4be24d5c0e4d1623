"""LeaderOptimizer (LSGD, multi-leader LSGD) and ElasticAveragingOptimizer (EASGD) for Keras 3 optimizers.

The same names, arguments and semantics as horovod_ext.torch's (the schedule, groups, election and settings check
are horovod_ext.consensus's); this module moves tensors, eagerly or inside tf.function (model.fit). The wrapped
optimizer's apply() first pulls the variables (x += sum_k w_k (x_k - x), every force from the same x), then runs
the optimizer's own step on the rank's own gradients.

Inside a graph the schedule and the election run in tf.py_function (the Python of horovod_ext.consensus), and the
broadcast from the elected leader is a tf.switch_case over the members, each branch a broadcast from one root
(Horovod's broadcast takes its root as a constant). Every rank takes the same branch: the election is computed
from one allgather of every rank's loss window. A NaN loss or a missing one raises FloatingPointError /
ValueError eagerly and tf.errors.InvalidArgumentError / UnknownError with the same message in a graph.

The training loss: ``optimizer.report_loss(loss)`` in a custom loop (eager or tf.function), and
``hvd.callbacks.ReportLossCallback()`` with model.fit (it reports the loss Keras logs after each batch).
State (step, loss window, leaders, the EASGD center) is in ``optimizer.horovod_ext``, a tf.Module:
``tf.train.Checkpoint(horovod_ext=optimizer.horovod_ext)``.

``asynchronous=True`` is accepted, checked and compared across ranks as in PyTorch, and runs synchronously, with
a warning (SYNCHRONOUS_FALLBACK says why): Horovod's TensorFlow collectives have no handles.
"""
import contextlib
import functools
import itertools
import warnings

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from horovod_ext.compression import CompressionStats
from horovod_ext.compression.consistency import allgather_blobs
from horovod_ext.compression.horovod_args import check_named_parameters
from horovod_ext.consensus import ElasticSync, LeaderSync
from horovod_ext.consensus.accounting import account_dense_reference
from horovod_ext.consensus.agreement import build_on_every_rank, level_process_sets
from horovod_ext.consensus.leader import ELASTIC_EVALUATION, LEADER_EVALUATION, check_evaluation
from .aggregator import collective_name, variable_names
from .backend import numpy_allgather

_ids = itertools.count()

SYNCHRONOUS_FALLBACK = (
    "horovod_ext.tensorflow: asynchronous=True runs synchronously (max_staleness 0). Horovod's TensorFlow "
    "collectives are TensorFlow ops with no handle to wait on later (horovod.tensorflow has no *_async, poll or "
    "synchronize): eagerly, an op returns once its collective has completed, and inside tf.function (model.fit "
    "included) every op of a step completes before the step's call returns. So a transfer started in one step "
    "cannot overlap the next steps. horovod_ext.torch's LeaderOptimizer and ElasticAveragingOptimizer run "
    "asynchronously (Horovod's torch API returns handles).")


def _value(v):
    return tf.convert_to_tensor(v)


class _SyncState(tf.Module):
    """Step counter, loss window and (EASGD) center of one wrapped optimizer, plus its Python bookkeeping."""

    what = None

    def __init__(self, sync, name):
        super().__init__(name=name)
        self.sync = sync
        self.tag = f"hvdext.{self.what}.{next(_ids)}"
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="loss_sum")
            self.loss_count = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="loss_count")
        self.stats = CompressionStats(self.what, timed=False)
        self.variables_seen = None

    def report_loss(self, loss):
        """Add a training loss (a number or a scalar tensor) to the window the leader is elected by."""
        loss = tf.cast(tf.reshape(loss, []), tf.float64) if tf.is_tensor(loss) else tf.constant(float(loss), tf.float64)
        self.loss_sum.assign_add(loss)
        self.loss_count.assign_add(1.0)

    def _account_step(self, variables):
        """Python, once per step (eagerly or from py_function): the dense reference and this step's rounds."""
        param_bytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)
        account_dense_reference(self.stats, sum(int(np.prod(v.shape)) for v in variables), param_bytes, hvd.size())
        return param_bytes

    def _python(self, fn, inputs, tout):
        """Run fn on the inputs' values: directly when eager, through tf.py_function inside a graph."""
        if tf.executing_eagerly():
            return fn(*[np.asarray(i) for i in inputs])
        out = tf.py_function(lambda *a: fn(*[x.numpy() for x in a]), inputs, tout)
        return out

    def before_apply(self, variables):
        raise NotImplementedError

    def compression_stats(self):
        stats = self.stats.as_dict()
        stats.update(ranks=hvd.size(), optimizer=self.what)
        return stats


class _LeaderState(_SyncState):
    what = "LeaderOptimizer"

    def __init__(self, sync, name):
        super().__init__(sync, name)
        with tf.init_scope():
            self.best_rank = tf.Variable(0, dtype=tf.int32, trainable=False, name="best_rank")
            self.last_election = tf.Variable(0, dtype=tf.int64, trainable=False, name="last_election")
        self.process_sets = level_process_sets(sync, hvd.size(), hvd.add_process_set)

    def _due_mask(self, step, variables):
        """Bit i set: level i pulls at this step. Also counts this step's bytes."""
        param_bytes = self._account_step(variables)
        due = self.sync.due(int(step))
        self.sync.account(self.stats, due, param_bytes, hvd.size())
        self.stats.end_step()
        return np.int32(sum(1 << i for i, level in enumerate(self.sync.levels) if level in due))

    def _elect(self, windows, step, last):
        """Leaders as indices into each level's members, then the best rank (raises on every rank)."""
        self.sync.last_election = int(last)
        leaders = self.sync.elect([(float(s), int(c)) for s, c in np.asarray(windows)], int(step))
        out = [level.members.index(leaders[level.name]) for level in self.sync.levels]
        return [np.int32(i) for i in out + [self.sync.best_rank]]

    def _broadcast_all(self, variables, names, root, level):
        ps = self.process_sets[level.name]
        return [hvd.broadcast(_value(v), root_rank=root, name=collective_name(f"{self.tag}.{level.name}.{root}", i, n),
                              ignore_name_scope=True, process_set=ps) for i, (v, n) in enumerate(zip(variables, names))]

    def before_apply(self, variables):
        names = variable_names(variables)
        step = self.step.assign_add(1)
        mask = self._python(lambda s: self._due_mask(s, variables), [step], tf.int32)
        mask = tf.reshape(mask, [])

        def communicate():
            window = tf.reshape(tf.stack([self.loss_sum.read_value(), self.loss_count.read_value()]), [1, 2])
            windows = hvd.allgather(window, name=f"{self.tag}.losses", ignore_name_scope=True)
            picked = self._python(self._elect, [windows, step, self.last_election.read_value()],
                                  [tf.int32] * (len(self.sync.levels) + 1))
            picked = [tf.reshape(p, []) for p in picked]
            current = [_value(v) for v in variables]
            forces = [tf.zeros_like(x) for x in current]
            sources = self.sync.transfer_levels(self.sync.levels)
            received = {}
            for i, level in enumerate(self.sync.levels):
                if level.name not in sources:
                    continue
                source = sources[level.name]
                due = tf.not_equal(tf.bitwise.bitwise_and(mask, 1 << i), 0)
                if source.name != level.name:  # the same members, due whenever this level is: its leader's bits
                    targets = tf.cond(due, lambda s=received[source.name]: list(s), lambda: list(current))
                else:
                    branches = [lambda r=r, level=level: self._broadcast_all(variables, names, r, level)
                                for r in level.members]
                    targets = tf.cond(due, lambda b=branches, i=i: tf.switch_case(picked[i], b),
                                      lambda: list(current))
                    received[level.name] = targets
                forces = [f + (t - x) * tf.constant(level.weight, x.dtype)
                          for f, t, x in zip(forces, targets, current)]
            updates = [v.assign_add(f) for v, f in zip(variables, forces)]
            with tf.control_dependencies(updates):
                return tf.group(self.loss_sum.assign(0.0), self.loss_count.assign(0.0),
                                self.best_rank.assign(picked[-1]), self.last_election.assign(step))

        return tf.cond(tf.not_equal(mask, 0), communicate, tf.no_op)

    @contextlib.contextmanager
    def evaluation_parameters(self, variables, which="leader"):
        check_evaluation(which, LEADER_EVALUATION, self.what)
        root = int(self.best_rank.numpy())
        names = variable_names(variables)
        if which == "center":
            values = [hvd.allreduce(_value(v), op=hvd.Average, ignore_name_scope=True,
                                    name=collective_name(f"{self.tag}.evaluate_center", i, n))
                      for i, (v, n) in enumerate(zip(variables, names))]
        else:
            values = [hvd.broadcast(_value(v), root_rank=root, name=collective_name(f"{self.tag}.evaluate", i, n),
                                    ignore_name_scope=True) for i, (v, n) in enumerate(zip(variables, names))]
        with _swapped_in(variables, values):
            yield

    def compression_stats(self):
        stats = super().compression_stats()
        stats.update(best_rank=int(self.best_rank.numpy()), last_election=int(self.last_election.numpy()))
        return stats


class _ElasticState(_SyncState):
    what = "ElasticAveragingOptimizer"

    def __init__(self, sync, name):
        super().__init__(sync, name)
        with tf.init_scope():
            self.center_ready = tf.Variable(False, trainable=False, name="center_ready")
        self.center = []

    def _centers(self, variables):
        if not self.center:
            with tf.init_scope():
                self.center = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"center_{i}")
                               for i, v in enumerate(variables)]
        return self.center

    def _mean(self, variables, names, label):
        return [hvd.allreduce(_value(v), op=hvd.Average, name=collective_name(f"{self.tag}.{label}", i, n),
                              ignore_name_scope=True) for i, (v, n) in enumerate(zip(variables, names))]

    def _due(self, step, variables):
        param_bytes = self._account_step(variables)
        if int(step) == 1 and not bool(self.center_ready.numpy()):
            self.sync.account(self.stats, param_bytes, hvd.size())  # the center's initialization
        due = self.sync.due(int(step))
        if due:
            self.sync.account(self.stats, param_bytes, hvd.size())
        self.stats.end_step()
        return np.bool_(due)

    def _initialize(self, variables, names):
        centers = self._centers(variables)

        def init():
            means = self._mean(variables, names, "center")
            with tf.control_dependencies([c.assign(m) for c, m in zip(centers, means)]):
                return tf.group(self.center_ready.assign(True))

        return tf.cond(self.center_ready.read_value(), tf.no_op, init)

    def before_apply(self, variables):
        names = variable_names(variables)
        centers = self._centers(variables)
        step = self.step.assign_add(1)
        due = tf.reshape(self._python(lambda s: self._due(s, variables), [step], tf.bool), [])
        with tf.control_dependencies([self._initialize(variables, names)]):
            def communicate():
                current = [_value(v) for v in variables]
                old = [c.read_value() for c in centers]
                means = self._mean(variables, names, "round")
                beta = self.sync.beta
                ops = []
                for v, x, c_old, c, m in zip(variables, current, old, centers, means):
                    ops.append(v.assign_add((c_old - x) * tf.constant(self.sync.alpha, x.dtype)))
                    ops.append(c.assign(c_old * tf.constant(1.0 - beta, x.dtype) + m * tf.constant(beta, x.dtype)))
                return tf.group(*ops)

            return tf.cond(due, communicate, tf.no_op)

    @contextlib.contextmanager
    def evaluation_parameters(self, variables, which="center"):
        check_evaluation(which, ELASTIC_EVALUATION, self.what)
        self._initialize(variables, variable_names(variables))
        with _swapped_in(variables, [c.read_value() for c in self._centers(variables)]):
            yield


@contextlib.contextmanager
def _swapped_in(variables, values):
    saved = [tf.identity(_value(v)) for v in variables]
    for v, x in zip(variables, values):
        v.assign(x)
    try:
        yield
    finally:
        for v, x in zip(variables, saved):
            v.assign(x)


def _wrap(optimizer, state_class, make_sync, arguments, named_parameters):
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"{state_class.what} needs a Keras 3 optimizer (keras.optimizers.SGD, Adam, ...); got "
                        f"{type(optimizer).__module__}.{type(optimizer).__name__}")
    check_named_parameters(named_parameters, None, state_class.what)  # the Keras optimizer is not built yet
    named = list(named_parameters) if named_parameters is not None else []
    tensors = [(n, tuple(v.shape), tf.as_dtype(v.dtype).name) for n, v in named]
    n = next(_ids)
    with tf.init_scope():
        gather = functools.partial(allgather_blobs, allgather=numpy_allgather(), tag=f"hvdext.{state_class.what}.{n}")
        sync = build_on_every_rank(make_sync, arguments, tensors, gather,
                                   hvd.rank(), hvd.size(), state_class.what)
        if sync.staleness:
            warnings.warn(SYNCHRONOUS_FALLBACK, RuntimeWarning, stacklevel=3)
            sync.staleness = 0
        state = state_class(sync, name=f"horovod_ext_{state_class.what}_{n}")
    base = optimizer.__class__
    fixed = [v for _, v in named] or None

    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables) if trainable_variables is not None else list(self._trainable_variables)
        with tf.control_dependencies([self.horovod_ext.before_apply(variables)]):
            return base.apply(self, grads, trainable_variables)

    def report_loss(self, loss):
        return self.horovod_ext.report_loss(loss)

    def evaluation_parameters(self, which=None):
        """Context manager: the model holds the best worker's variables (LSGD, which="leader"), the workers'
        average (LSGD, which="center") or EASGD's center inside the block, its own after. LSGD's is collective:
        every rank enters it."""
        variables = fixed or list(self._trainable_variables)
        return self.horovod_ext.evaluation_parameters(variables, *([] if which is None else [which]))

    def compression_stats(self):
        return self.horovod_ext.compression_stats()

    cls = type(base.__name__, (base,), {"apply": apply, "report_loss": report_loss,
                                        "evaluation_parameters": evaluation_parameters,
                                        "compression_stats": compression_stats})
    wrapped = cls.from_config(optimizer.get_config())
    object.__setattr__(wrapped, "horovod_ext", state)  # not a Keras-tracked attribute
    return wrapped


def LeaderOptimizer(optimizer, named_parameters=None, pull=0.1, global_pull=0.1, period=4, global_period=16,
                    groups="node", asynchronous=False, max_staleness=None):
    """Leader SGD (LSGD, Teng et al. 2019) for a Keras 3 optimizer: see horovod_ext.torch.LeaderOptimizer for
    the math and the arguments, which are the same. named_parameters (optional): (name, variable) pairs, checked
    across ranks and used by evaluation_parameters(); by default the variables the optimizer trains.
    asynchronous=True runs synchronously, with a warning: SYNCHRONOUS_FALLBACK."""
    arguments = {"pull": pull, "global_pull": global_pull, "period": period, "global_period": global_period,
                 "groups": groups, "asynchronous": asynchronous, "max_staleness": max_staleness}
    return _wrap(optimizer, _LeaderState, lambda: LeaderSync(size=hvd.size(), **arguments), arguments,
                 named_parameters)


def ElasticAveragingOptimizer(optimizer, named_parameters=None, beta=0.9, period=4, asynchronous=False,
                              max_staleness=None):
    """Synchronous EASGD (Zhang et al. 2015) for a Keras 3 optimizer: see
    horovod_ext.torch.ElasticAveragingOptimizer. asynchronous=True runs synchronously, with a warning."""
    arguments = {"beta": beta, "period": period, "asynchronous": asynchronous, "max_staleness": max_staleness}
    return _wrap(optimizer, _ElasticState, lambda: ElasticSync(size=hvd.size(), **arguments), arguments,
                 named_parameters)
