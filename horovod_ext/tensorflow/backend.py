"""The TensorFlow backend of the communication plan (horovod_ext/compression/plan.py has the contract), eager and
inside tf.function: Horovod's TensorFlow collectives (a future is the result tensor itself: TensorFlow orders the
ops by their data), the custom ops, residuals as tf.Variables, host decisions in tf.py_function, branches as
tf.switch_case, failed requirements collected eagerly and as assertions in a graph."""
import contextlib
import re

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from .ops import TFKernels

OPS = {"sum": hvd.Sum, "average": hvd.Average, "max": hvd.Max}
DTYPES = {"float32": tf.float32, "float64": tf.float64, "int32": tf.int32, "int64": tf.int64, "uint8": tf.uint8}
NONFINITE = "NaN or Inf in the gradient of "


def collective_name(prefix, index, name):
    """Horovod's name for a tensor's collective. Inside tf.function Horovod takes names containing '/' apart, so
    'a/dense/bias' and 'a/dense_1/bias' collide ("a tensor with the same name ... is currently being processed");
    the index keeps normalized names unique. (The random key uses the real name.)"""
    return f"{prefix}.{index}." + re.sub(r"[^A-Za-z0-9_.]", "_", name)


class TFBackend:
    kernels = TFKernels

    def __init__(self, module, process_set, op, predivide, stats):
        self.module = module  # the tf.Module that tracks the residual variables (checkpoints)
        self.process_set, self.stats = process_set, stats
        self.nranks, self.rank = process_set.size(), process_set.rank()
        self.op, self.predivide = op, predivide
        self.divisor = float(self.nranks) if op == hvd.Average else 1.0
        self.step = self.seed = None
        self.errors, self.guards = [], []
        self.per_step = {}  # bytes counted while the step is built (the same every step)
        self.decided_total, self.decided_last = {}, {}  # bytes counted at host decisions, as they are taken
        self.runtime_total, self.runtime_last = {}, {}  # bytes of entropy-coded payloads, as the steps run
        self.runtime = []  # in a graph: (field, size tensor) of the step being built
        self.host_state_hooks = {}  # key: (reload from its variable, save into it), set by the aggregator

    def begin(self, step, seed):
        """A new step is being built (eagerly: run)."""
        self.step, self.seed = step, seed
        self.errors, self.guards, self.per_step, self.runtime = [], [], {}, []
        if tf.executing_eagerly():
            self.runtime_last = {}

    # ------------------------------------------------------------------------------------------------ tensors
    @staticmethod
    def flat32(g):
        return tf.reshape(tf.cast(g, tf.float32), [-1])

    @staticmethod
    def copy(x):
        return tf.identity(x)

    @staticmethod
    def stack(values, dtype):
        return tf.stack([tf.cast(v, DTYPES[dtype]) for v in values])

    @staticmethod
    def unstack(t, n):
        return tf.unstack(t, num=n)

    @staticmethod
    def concat(parts):
        return parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)

    @staticmethod
    def sum(values):
        return tf.add_n(values) if values else tf.constant(0.0, tf.float64)

    @staticmethod
    def sub(a, b):
        return tf.subtract(a, b)

    @staticmethod
    def where_nonzero(test, a, b):
        return tf.where(tf.not_equal(test, 0.0), a, b)

    @staticmethod
    def size(x):
        return tf.size(x)

    @staticmethod
    def equal(x, value):
        return tf.equal(x, value)

    @staticmethod
    def no_flag():
        return tf.constant(-1, tf.int32)

    @staticmethod
    def all_finite(x):
        return tf.reduce_all(tf.math.is_finite(x))

    @staticmethod
    def k_of(numel, cf, upper=None):
        return tf.clip_by_value(tf.cast(tf.math.ceil(numel / cf), tf.int32), 1, numel if upper is None else upper)

    # -------------------------------------------------------------------------------------------- collectives
    def allreduce(self, x, name, op):
        return hvd.allreduce(x, op=OPS[op], name=name, ignore_name_scope=True, process_set=self.process_set)

    def allreduce_grad(self, item, name, compression=None):
        compression = compression or hvd.Compression.none
        compressed, ctx = compression.compress(item.grad)
        item.payload_bytes = item.numel * compressed.dtype.size
        scale = {} if self.predivide == 1.0 else {"prescale_factor": 1.0 / self.predivide,
                                                   "postscale_factor": self.predivide}
        reduced = hvd.allreduce(compressed, op=self.op, name=name, ignore_name_scope=True,
                                process_set=self.process_set, **scale)
        return compression.decompress(reduced, ctx)

    def allgather(self, x, name):
        return hvd.allgather(x, name=name, ignore_name_scope=True, process_set=self.process_set)

    def alltoall(self, x, splits, name):
        splits = tf.cast(splits, tf.int32) if tf.is_tensor(splits) else tf.constant(splits, dtype=tf.int32)
        received, _ = hvd.alltoall(x, splits=splits, name=name, ignore_name_scope=True,
                                   process_set=self.process_set)
        return received

    @staticmethod
    def wait(future):
        return future

    @staticmethod
    def name(prefix, item):
        return collective_name(f"hvdext.{prefix}", item.index, item.name)

    @staticmethod
    def step_name(prefix):
        return f"hvdext.{prefix}"

    # ------------------------------------------------------------------------------------------ host, control
    @staticmethod
    def host(fn, args, dtypes):
        def call(*values):
            result = fn(*[v.numpy().tolist() for v in values])
            result = result if isinstance(result, tuple) else (result,)
            return [tf.constant(r, DTYPES[d]) for r, d in zip(result, dtypes)]

        return tuple(tf.py_function(call, list(args), [DTYPES[d] for d in dtypes]))

    @staticmethod
    def numpy(fn, args, dtypes):
        def call(*values):
            result = fn(*values)
            result = result if isinstance(result, tuple) else (result,)
            return [np.ascontiguousarray(r, dtype=d) if np.ndim(r) else np.asarray(r, dtype=d)
                    for r, d in zip(result, dtypes)]

        return tuple(tf.numpy_function(call, list(args), [DTYPES[d] for d in dtypes]))

    @staticmethod
    def switch(index, branches):
        return tf.switch_case(index, branches)

    def require(self, truth, detail, value=None):
        if tf.executing_eagerly():
            if not bool(truth):
                self.errors.append(detail.replace("{}", str(int(value))) if value is not None else detail)
            return
        head, _, tail = detail.partition("{}")
        data = [NONFINITE + head] + ([value, tail] if value is not None else [])
        self.guards.append(tf.debugging.Assert(truth, data))

    def failed(self):
        return bool(self.errors)

    def guarded(self, x):
        if not self.guards:
            return x
        with tf.control_dependencies(self.guards):
            return tf.identity(x)

    @staticmethod
    def timed(field):
        return contextlib.nullcontext()  # a tf.function runs as one graph: seconds are not measured in TensorFlow

    def count(self, **amounts):
        for key, value in amounts.items():
            self.per_step[key] = self.per_step.get(key, 0) + value

    def count_runtime(self, **amounts):
        if tf.executing_eagerly():
            self._add_runtime({key: float(value) for key, value in amounts.items()})
        else:
            self.runtime.extend(amounts.items())

    def _add_runtime(self, amounts, new_step=False):
        if new_step:
            self.runtime_last = {}
        for key, value in amounts.items():
            self.runtime_last[key] = self.runtime_last.get(key, 0) + value
            self.runtime_total[key] = self.runtime_total.get(key, 0) + value

    def runtime_counted(self):
        """In a graph: one host op that adds the step's runtime byte counts (a control dependency of its
        outputs), or None."""
        if not self.runtime:
            return None
        fields = sorted({key for key, _ in self.runtime})
        totals = [tf.add_n([tf.cast(v, tf.float64) for key, v in self.runtime if key == f]) for f in fields]

        def add(*values):
            self._add_runtime(dict(zip(fields, (float(v) for v in values))), new_step=True)
            return np.int32(0)

        return tf.numpy_function(add, totals, tf.int32)

    def count_decided(self, **amounts):
        self.decided_last = dict(amounts)
        for key, value in amounts.items():
            self.decided_total[key] = self.decided_total.get(key, 0) + value

    def host_state_loaded(self, key, state):
        """Before host state is read: the aggregator reloads it if a checkpoint restored its variable."""
        if key in self.host_state_hooks:
            self.host_state_hooks[key][0](state)

    def host_state_saved(self, key, state):
        """After host state changed: the aggregator keeps it in the variable a checkpoint holds."""
        if key in self.host_state_hooks:
            self.host_state_hooks[key][1](state)

    # ------------------------------------------------------------------------------------------------- state
    def residual(self, name, n, item=None):
        with tf.init_scope():
            variable = tf.Variable(tf.zeros([n]), trainable=False, name="residual_" + re.sub(r"[^A-Za-z0-9_]", "_",
                                                                                             name))
        self.module.residuals[name] = variable
        return variable

    @staticmethod
    def read(state):
        return state.read_value()

    @staticmethod
    def assign(state, value):
        state.assign(value)

    @staticmethod
    def reset(state):
        state.assign(tf.zeros_like(state))

    @staticmethod
    def export(state):
        return state.numpy()

    def imported_residual(self, name, values):
        variable = self.residual(name, int(np.size(values)))
        variable.assign(tf.cast(tf.reshape(values, [-1]), tf.float32))
        return variable

    @staticmethod
    def imported(values):
        return tf.cast(tf.reshape(values, [-1]), tf.float32)

    # ------------------------------------------------------------------------------------------------ output
    @staticmethod
    def output_buffer(item):
        return None

    @staticmethod
    def write(item, flat):
        item.result = tf.cast(tf.reshape(flat, item.grad.shape), item.grad.dtype)
