"""LeaderOptimizer (LSGD, multi-leader LSGD) and ElasticAveragingOptimizer (EASGD) for Keras 3 optimizers.

The same names, arguments and semantics as horovod_ext.torch's; the whole step is horovod_ext.consensus's
(step.py), run eagerly or inside tf.function (model.fit) on this module's backend: Horovod's TensorFlow
collectives, the variables, and the optimizer's state in tf.Variables. The wrapped optimizer's apply() first runs
the step (the pull: x += sum_k w_k (x_k - x), every force from the same x), then the optimizer's own step on the
rank's own gradients.

Inside a graph the schedule and the election run in tf.py_function, and the broadcast from the elected leader is a
tf.switch_case over the members, each branch a broadcast from one root (Horovod's broadcast takes its root as a
constant). Every rank takes the same branch: the election is computed from one allgather of every rank's loss
window. A NaN loss or a missing one raises FloatingPointError / ValueError eagerly and
tf.errors.InvalidArgumentError / UnknownError with the same message in a graph.

The training loss: ``optimizer.report_loss(loss)`` in a custom loop (eager or tf.function), and
``hvd.callbacks.ReportLossCallback()`` with model.fit (it reports the loss Keras logs after each batch).
State (step, loss window, the elected leaders, the EASGD center) is in ``optimizer.horovod_ext``, a tf.Module:
``tf.train.Checkpoint(horovod_ext=optimizer.horovod_ext)``.

``asynchronous=True`` is accepted, checked and compared across ranks as in PyTorch, and runs synchronously, with
a warning (SYNCHRONOUS_FALLBACK says why): Horovod's TensorFlow collectives have no handles.
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
from horovod_ext.compression.generation import named
from horovod_ext.consensus import ElasticSync, LeaderSync
from horovod_ext.consensus.agreement import build_on_every_rank
from horovod_ext.consensus.backend import ParameterBackend
from horovod_ext.consensus.leader import ELASTIC_EVALUATION, LEADER_EVALUATION, check_evaluation
from horovod_ext.consensus.state import ParameterState
from horovod_ext.consensus.step import ElasticStep, LeaderStep
from .optimizer import variable_names
from .backend import (DTYPES, HostStateVariable, as_tuple, barrier_over_every_rank, collective_name,
                      numpy_allgather)
from .elastic_state import assign_all, broadcast_variables, numpy_values
from .wrapping import checked_named_tensors, wrap

_ids = itertools.count()

SYNCHRONOUS_FALLBACK = (
    "horovod_ext.tensorflow: asynchronous=True runs synchronously (max_staleness 0). Horovod's TensorFlow "
    "collectives are TensorFlow ops with no handle to wait on later (horovod.tensorflow has no *_async, poll or "
    "synchronize): eagerly, an op returns once its collective has completed, and inside tf.function (model.fit "
    "included) every op of a step completes before the step's call returns. So a transfer started in one step "
    "cannot overlap the next steps. horovod_ext.torch's LeaderOptimizer and ElasticAveragingOptimizer run "
    "asynchronously (Horovod's torch API returns handles).")


def _grouped(result):
    """An op that runs `result` (an op, a tensor, a list or tuple of them, or None)."""
    if result is None:
        return tf.no_op()
    return tf.group(*result) if isinstance(result, (list, tuple)) else tf.group(result)


class TFParameterState(ParameterState):
    """The optimizer's state in the module's tf.Variables (checkpointed with it); EASGD's center variables are made
    at its first use, shaped as the variables the backend is bound to."""

    def __init__(self, module, backend):
        self.module, self.backend = module, backend
        self.sync_state = HostStateVariable(module.sync_state)

    def advance_step(self):
        return self.module.step.assign_add(1)

    def loss_window(self):
        m = self.module
        return tf.reshape(tf.stack([m.loss_sum.read_value(), m.loss_count.read_value()]), [1, 2])

    def reset_loss_window(self):
        return tf.group(self.module.loss_sum.assign(0.0), self.module.loss_count.assign(0.0))

    def _centers(self):
        m = self.module
        if not m.center:
            with tf.init_scope():
                m.center = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"center_{i}")
                            for i, v in enumerate(self.backend.variables)]
        return m.center

    def center(self):
        return [c.read_value() for c in self._centers()]

    def center_ready(self):
        return self.module.center_ready.read_value()

    def set_center(self, values):
        ops = [c.assign(v) for c, v in zip(self._centers(), values)]
        with tf.control_dependencies(ops):
            return tf.group(self.module.center_ready.assign(True))

    def shared_state_read(self, owner):
        """The owner takes on module.sync_state if a checkpoint restored it."""
        self.sync_state.read(owner)

    def shared_state_written(self, owner):
        self.sync_state.write(owner)


class TFParameterBackend(ParameterBackend):
    """The variables given to apply() (bound per call) and Horovod's TensorFlow collectives (a future is its result
    tensor)."""

    def __init__(self):
        self.nranks, self.rank = hvd.size(), hvd.rank()
        self.variables, self.names = [], []
        self.sets = {}

    def bind(self, variables):
        self.variables, self.names = list(variables), variable_names(variables)

    # ----------------------------------------------------------------------------------------------- parameters
    def parameters(self):
        return [tf.convert_to_tensor(v) for v in self.variables]

    def add_to_parameters(self, forces):
        if forces is None:
            return None
        return tf.group(*[v.assign_add(f) for v, f in zip(self.variables, forces)])

    def assign_parameters(self, values):
        for v, x in zip(self.variables, values):
            v.assign(x)

    @staticmethod
    def copy(values):
        return [tf.identity(v) for v in values]

    # ---------------------------------------------------------------------------------------------- collectives
    @staticmethod
    def allgather(x, name):
        return hvd.allgather(x, name=name, ignore_name_scope=True)

    def broadcast(self, values, root, level, name):
        """Horovod's broadcast takes its root as a constant: a tensor root is a tf.switch_case over the members."""
        members = list(range(self.nranks)) if level is None else level.members
        where = {} if level is None else {"process_set": self.sets[level.name]}

        def from_rank(rank):
            return [hvd.broadcast(v, root_rank=rank, name=collective_name(f"{name}.{rank}", i, n),
                                  ignore_name_scope=True, **where) for i, (v, n) in enumerate(zip(values, self.names))]

        if not tf.is_tensor(root):
            return from_rank(members[int(root)])
        return tf.switch_case(root, [functools.partial(from_rank, rank) for rank in members])

    def allreduce_mean(self, values, name):
        return [hvd.allreduce(v, op=hvd.Average, name=collective_name(name, i, n), ignore_name_scope=True)
                for i, (v, n) in enumerate(zip(values, self.names))]

    @staticmethod
    def wait(future):
        return future

    @staticmethod
    def done(value):
        return value

    @staticmethod
    def add_process_set(ranks):
        return hvd.add_process_set(ranks)

    @staticmethod
    def barrier():
        barrier_over_every_rank()

    # ------------------------------------------------------------------------------------------ host, control
    @staticmethod
    def host(fn, args, dtypes):
        """Eagerly fn is called directly (its errors are raised as they are); in a graph through tf.py_function."""
        if tf.executing_eagerly():
            result = fn(*[np.asarray(a).tolist() for a in args])
            return result if isinstance(result, tuple) else (result,)
        out = tf.py_function(lambda *a: fn(*[x.numpy().tolist() for x in a]), list(args), [DTYPES[d] for d in dtypes])
        return tuple(tf.reshape(x, []) for x in as_tuple(out))

    @staticmethod
    def _truth(truth):
        return tf.not_equal(truth, 0) if truth.dtype != tf.bool else truth

    def cond(self, truth, true_fn, false_fn):
        if not tf.is_tensor(truth):
            return true_fn() if truth else false_fn()
        return tf.cond(self._truth(truth), true_fn, false_fn)

    def when(self, truth, fn, otherwise=None):
        if not tf.is_tensor(truth):
            return fn() if truth else (otherwise() if otherwise is not None else None)
        return tf.cond(self._truth(truth), lambda: _grouped(fn()),
                       lambda: _grouped(otherwise() if otherwise is not None else None))

    @staticmethod
    def bit(mask, i):
        if not tf.is_tensor(mask):
            return bool(int(mask) & (1 << i))
        return tf.not_equal(tf.bitwise.bitwise_and(mask, 1 << i), 0)

    @staticmethod
    def after(first, fn):
        if first is None or tf.executing_eagerly():
            return fn()
        with tf.control_dependencies([first]):
            return _grouped(fn())

    @staticmethod
    def timed():
        return contextlib.nullcontext()  # a tf.function runs as one graph: seconds are not measured


class _State(tf.Module):
    """The optimizer's state (step counter, loss window, the sync state every rank shares as JSON, EASGD's center)
    for tf.train.Checkpoint, and the consensus step that runs on it. build() makes the sync for the job's current
    membership (collective: build_on_every_rank)."""

    def __init__(self, build, step_class, name):
        super().__init__(name=name)
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="loss_sum")
            self.loss_count = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="loss_count")
            self.sync_state = tf.Variable("", dtype=tf.string, trainable=False, name="sync_state")
            self.center_ready = tf.Variable(False, trainable=False, name="center_ready")
        self.center = []
        self._build, self._step_class = build, step_class
        sync = build()
        self._tag = f"hvdext.{sync.what}.{next(_ids)}"
        self.stats = CompressionStats(sync.what, timed=False)
        self._make_runner(sync)

    def _make_runner(self, sync):
        self.backend = TFParameterBackend()
        self.runner = self._step_class(sync, self.backend, TFParameterState(self, self.backend), self.stats,
                                       named(self._tag, sync.generation), 0, 0)
        self.backend.sets = getattr(self.runner, "process_sets", {})

    # ------------------------------------------------------------------------------------- elastic training
    def _values(self):
        return [self.step, self.loss_sum, self.loss_count, self.sync_state, self.center_ready, *self.center]

    def elastic_commit(self):
        """This rank's state at a commit (tensorflow/elastic_state.py): the step counter, its loss window, the
        elected leaders, EASGD's center."""
        return {"values": numpy_values(self._values()), "centers": len(self.center), "stats": self.stats.state()}

    def elastic_restore(self, saved):
        del self.center[saved["centers"]:]  # a center made after the commit is made again
        assign_all(self._values(), saved["values"])
        self.stats.load_state(saved["stats"])  # a step redone is counted once

    def elastic_reset(self):
        """After Horovod's elastic reset (keras/elastic.py): the step is built again for the new membership
        (collective: the arguments checked on every rank, LSGD's groups made into process sets again, EASGD's
        alpha = beta/p); the step counter, the loss window and EASGD's center carry over, the elected leaders do
        not (their ranks are gone or renumbered): the next election elects again. The step's function must be
        traced again (KerasState drops the model's)."""
        with tf.init_scope():
            self.sync_state.assign("")
            self._make_runner(self._build())

    def elastic_sync(self):
        """Rank 0's step counter, statistics and EASGD's center on every rank (an added rank has no center
        variables yet: they come as values and are made here); the loss window stays each rank's own."""
        with tf.init_scope():
            broadcast_variables([self.step, self.center_ready], "horovod_ext")
            root = broadcast_object({"center": numpy_values(self.center), "stats": self.stats.state()},
                                    name="hvdext.elastic.leader_state")
            self.stats.load_state(root["stats"])
            center = root["center"]
            if center and not self.center:
                self.center = [tf.Variable(value, trainable=False, name=f"center_{i}")
                               for i, value in enumerate(center)]
            else:
                assign_all(self.center, center)

    @property
    def sync(self):
        return self.runner.sync

    def report_loss(self, loss):
        """Add a training loss (a number or a scalar tensor) to the window the leader is elected by."""
        loss = tf.cast(tf.reshape(loss, []), tf.float64) if tf.is_tensor(loss) else tf.constant(float(loss), tf.float64)
        self.loss_sum.assign_add(loss)
        self.loss_count.assign_add(1.0)

    def bind(self, variables):
        self.backend.bind(variables)
        self.runner.numel = sum(int(np.prod(v.shape)) for v in variables)
        self.runner.param_bytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)

    def before_apply(self, variables):
        self.bind(variables)
        return self.runner.step()

    def evaluation_parameters(self, variables, which):
        self.bind(variables)
        return self.runner.swapped_in(self.runner.evaluation_values(which))

    def compression_stats(self):
        return self.runner.compression_stats()


def _wrap(optimizer, sync_class, step_class, arguments, named_parameters, evaluations, default):
    what = sync_class.what
    named, tensors = checked_named_tensors(optimizer, named_parameters, what)
    n = next(_ids)

    def build():
        """The sync for the job's current membership, built on every rank at once."""
        with tf.init_scope():
            gather = functools.partial(allgather_blobs, allgather=numpy_allgather(), tag=f"hvdext.{what}.{n}")
            sync = build_on_every_rank(lambda: sync_class(size=hvd.size(), **arguments), arguments, tensors,
                                       gather, hvd.rank(), hvd.size(), what)
        if sync.staleness:
            warnings.warn(SYNCHRONOUS_FALLBACK, RuntimeWarning, stacklevel=5)
            sync.staleness = 0
        return sync

    with tf.init_scope():
        state = _State(build, step_class, name=f"horovod_ext_{what}_{n}")
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
        which = default if which is None else which
        check_evaluation(which, evaluations, what)
        return self.horovod_ext.evaluation_parameters(fixed or list(self._trainable_variables), which)

    def compression_stats(self):
        return self.horovod_ext.compression_stats()

    return wrap(optimizer, {"apply": apply, "report_loss": report_loss, "evaluation_parameters": evaluation_parameters,
                            "compression_stats": compression_stats}, state)


def LeaderOptimizer(optimizer, named_parameters=None, pull=0.1, global_pull=0.1, period=4, global_period=16,
                    groups="node", asynchronous=False, max_staleness=None):
    """Leader SGD (LSGD, Teng et al. 2019) for a Keras 3 optimizer: see horovod_ext.torch.LeaderOptimizer for
    the math and the arguments, which are the same. named_parameters (optional): (name, variable) pairs, checked
    across ranks and used by evaluation_parameters(); by default the variables the optimizer trains.
    asynchronous=True runs synchronously, with a warning: SYNCHRONOUS_FALLBACK."""
    arguments = LeaderSync.arguments(pull, global_pull, period, global_period, groups, asynchronous, max_staleness)
    return _wrap(optimizer, LeaderSync, LeaderStep, arguments, named_parameters, LEADER_EVALUATION, "leader")


def ElasticAveragingOptimizer(optimizer, named_parameters=None, beta=0.9, period=4, asynchronous=False,
                              max_staleness=None):
    """Synchronous EASGD (Zhang et al. 2015) for a Keras 3 optimizer: see
    horovod_ext.torch.ElasticAveragingOptimizer. asynchronous=True runs synchronously, with a warning."""
    arguments = ElasticSync.arguments(beta, period, asynchronous, max_staleness)
    return _wrap(optimizer, ElasticSync, ElasticStep, arguments, named_parameters, ELASTIC_EVALUATION, "center")
