"""The TensorFlow backend of the communication plan (horovod_ext/compression/plan.py has the contract), eager and
inside tf.function: Horovod's TensorFlow collectives (a future is the result tensor itself: TensorFlow orders the
ops by their data), the custom ops, residuals as tf.Variables, host decisions in tf.py_function, branches as
tf.switch_case, failed requirements collected eagerly and as assertions in a graph."""
import json
import re

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from horovod_ext.compression.backend import Backend
from horovod_ext.compression.horovod_args import outside_process_set
from horovod_ext.compression.generation import named
from .kernels import TFKernels

OPS = {"sum": hvd.Sum, "average": hvd.Average, "max": hvd.Max}
DTYPES = {"float16": tf.float16, "float32": tf.float32, "float64": tf.float64, "int32": tf.int32,
          "int64": tf.int64, "uint8": tf.uint8}


def collective_name(prefix, index, name):
    """Horovod's name for a tensor's collective. Inside tf.function Horovod takes names containing '/' apart, so
    'a/dense/bias' and 'a/dense_1/bias' collide ("a tensor with the same name ... is currently being processed");
    the index keeps normalized names unique. (The random key uses the real name.)"""
    return f"{prefix}.{index}." + re.sub(r"[^A-Za-z0-9_.]", "_", name)


def numpy_allgather(process_set=None):
    """allgather(array, name) -> NumPy array over Horovod's TensorFlow allgather, eagerly
    (consistency.allgather_blobs)."""
    where = {} if process_set is None else {"process_set": process_set}

    def allgather(array, name):
        return hvd.allgather(tf.constant(array), name=name, ignore_name_scope=True, **where).numpy()

    return allgather


def barrier_over_every_rank():
    """Return once every rank has called this: a one-element allreduce over all ranks, eagerly
    (in_flight.leave_together)."""
    hvd.allreduce(tf.zeros([1]), name="horovod_ext.leave_together", op=hvd.Sum, ignore_name_scope=True)


class HostStateVariable:
    """Host state kept in a tf.string variable as JSON, so that a tf.train.Checkpoint holds it: the compressor
    methods' shared state and the leader optimizers' sync state (the backends' shared_state_read / _written)."""

    def __init__(self, variable):
        self.variable = variable
        self.written = None  # the JSON last stored in the variable (or taken on from it)

    def read(self, owner):
        """owner.load_shared_state() of the variable's value if a checkpoint restored it (it differs from what was
        stored)."""
        saved = self.variable.numpy().decode()
        if saved and saved != self.written:
            owner.load_shared_state(json.loads(saved))
            self.written = saved

    def write(self, owner):
        self.written = json.dumps(owner.shared_state())
        self.variable.assign(self.written)


def as_tuple(outputs):
    """tf.py_function / tf.numpy_function return a bare tensor for one output eagerly (a list in a graph)."""
    return tuple(outputs) if isinstance(outputs, (list, tuple)) else (outputs,)


class TFBackend(Backend):
    """Eager or building a tf.function: collectives are ops (a future is the result tensor), requirements are
    collected eagerly and become assertions in a graph, host state is mirrored in the module's variables."""

    kernels = TFKernels
    kernel_errors = (ValueError, tf.errors.InvalidArgumentError)  # how a kernel rejects a corrupted payload

    def __init__(self, module, process_set, op, predivide):
        self.module = module  # the tf.Module that tracks the residual variables (checkpoints)
        self.process_set = process_set
        # this rank's place in the set (None outside it, where Horovod raises and nothing is communicated)
        self.nranks, self.rank = process_set.size(), None if outside_process_set(process_set) else process_set.rank()
        self.op, self.predivide = op, predivide
        self.divisor = float(self.nranks) if op == hvd.Average else 1.0
        self.generation = 0  # the reset generation in collective names (compression/generation.py), once agreed
        self.method_state = HostStateVariable(module.method_state)

    @staticmethod
    def end_step(dense):
        """Nothing: step-level collective names are the same at every step (a graph's ops are made once)."""

    def ranks_training(self, name):
        """Eagerly only: inside tf.function the answer would be a tensor, and the choice between the dense and
        the compressed step is made while the graph is built (join.py)."""
        if not tf.executing_eagerly():
            return None
        count = hvd.allreduce(tf.constant([1], tf.int32), op=hvd.Sum, name=name, ignore_name_scope=True,
                              process_set=self.process_set)
        return int(count[0])  # wait() gives back what it is given

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
    def inner_products(a, b):
        a, b = tf.cast(a, tf.float64), tf.cast(b, tf.float64)
        return tf.stack([tf.reduce_sum(a * b), tf.reduce_sum(a * a), tf.reduce_sum(b * b)])

    @staticmethod
    def linear_compressor(name):
        return getattr(hvd.Compression, name)

    @staticmethod
    def concat(parts):
        return parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)

    @staticmethod
    def dtype_name(x):
        return x.dtype.name

    @staticmethod
    def bitcast(x, dtype):
        target = DTYPES[dtype]
        if target.size > x.dtype.size:  # tf.bitcast takes the wider type's elements as a last axis of the narrower
            x = tf.reshape(x, [-1, target.size // x.dtype.size])
        return tf.reshape(tf.bitcast(x, target), [-1])

    @staticmethod
    def sum(values):
        return tf.add_n(values) if values else tf.constant(0.0, tf.float64)

    @staticmethod
    def sub(a, b, in_place=False):
        return tf.subtract(a, b)

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
    def nothing(dtype):
        return tf.zeros([0], DTYPES[dtype])

    @staticmethod
    def all_finite(x):
        return tf.reduce_all(tf.math.is_finite(x))

    @staticmethod
    def all_finite_rows(x):
        return tf.unstack(tf.reduce_all(tf.math.is_finite(x), axis=1), num=int(x.shape[0]))

    @staticmethod
    def all_true(truths):
        """Eagerly: Python bools of the truths, the tensors among them stacked and read once."""
        out = [None if tf.is_tensor(t) else bool(t) for t in truths]
        positions = [i for i, value in enumerate(out) if value is None]
        if positions:
            values = tf.stack([tf.reshape(tf.cast(truths[i], tf.bool), []) for i in positions]).numpy().tolist()
            for i, value in zip(positions, values):
                out[i] = value
        return out

    @staticmethod
    def k_of(numel, cf, upper=None):
        return tf.clip_by_value(tf.cast(tf.math.ceil(numel / cf), tf.int32), 1, numel if upper is None else upper)

    # ------------------------------------------------------------------------------------ matrices (PowerSGD)
    @staticmethod
    def shape(x):
        return tuple(int(d) for d in x.shape)

    @staticmethod
    def reshape(x, shape):
        return tf.reshape(x, shape)

    @staticmethod
    def split(x, sizes):
        return list(tf.split(x, list(sizes)))

    @staticmethod
    def cast(x, dtype):
        return tf.cast(x, DTYPES[dtype])

    @staticmethod
    def scale(x, factor):
        return x * factor

    @staticmethod
    def matmul(a, b, transpose_a=False, transpose_b=False):
        return tf.linalg.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)

    @staticmethod
    def orthogonalize(x, method="gram_schmidt"):
        if method == "qr":
            return tf.linalg.qr(x, full_matrices=False)[0]
        tiny = np.finfo(np.float32).tiny
        cols = tf.unstack(x, axis=2)
        for j in range(len(cols)):
            # max|col| scaled to [1, 2) by a power of two first (exact): the norm of a column of tiny values does
            # not underflow (the NumPy reference's power_of_two_scale)
            amax = tf.bitcast(tf.reduce_max(tf.abs(cols[j]), axis=1, keepdims=True), tf.int32)
            biased = tf.bitwise.bitwise_and(tf.bitwise.right_shift(amax, 23), 0xFF)
            scaled = cols[j] * tf.bitcast(tf.bitwise.left_shift(tf.clip_by_value(254 - biased, 1, 254), 23),
                                          tf.float32)
            col = scaled / tf.maximum(tf.norm(scaled, axis=1, keepdims=True), tiny)
            cols[j] = col
            for i in range(j + 1, len(cols)):
                cols[i] = cols[i] - tf.reduce_sum(col * cols[i], axis=1, keepdims=True) * col
        return tf.stack(cols, axis=2)

    # -------------------------------------------------------------------------------------------- collectives
    def allreduce(self, x, name, op):
        return hvd.allreduce(x, op=OPS[op], name=name, ignore_name_scope=True, process_set=self.process_set)

    def allreduce_grad(self, item, name, compression=None):
        compression = compression or hvd.Compression.none
        compressed, ctx = compression.compress(item.grad)
        reduced = self.allreduce_buffer(compressed, name)
        return compression.decompress(reduced, ctx), item.numel * compressed.dtype.size

    def allreduce_buffer(self, x, name):
        scale = {} if self.predivide == 1.0 else {"prescale_factor": 1.0 / self.predivide,
                                                   "postscale_factor": self.predivide}
        return hvd.allreduce(x, op=self.op, name=name, ignore_name_scope=True, process_set=self.process_set,
                             **scale)

    def allreduce_sparse(self, item, name):
        g = item.grad
        with tf.device(getattr(self.module, "device_sparse", "")):
            reduced = hvd.allreduce(g, op=self.op, name=name, ignore_name_scope=True, process_set=self.process_set)
        sent = tf.size(g.values) * g.values.dtype.size + tf.size(g.indices) * g.indices.dtype.size
        return reduced, sent

    @staticmethod
    def densify(item):
        item.grad = tf.convert_to_tensor(item.grad)

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

    def name(self, prefix, item):
        return named(collective_name(f"hvdext.{prefix}", item.index, item.name), self.generation)

    def step_name(self, prefix):
        return named(f"hvdext.{prefix}", self.generation)

    stable_name = step_name

    # ------------------------------------------------------------------------------------------ host, control
    @staticmethod
    def host(fn, args, dtypes):
        def call(*values):
            result = fn(*[v.numpy().tolist() for v in values])
            result = result if isinstance(result, tuple) else (result,)
            return [tf.constant(r, DTYPES[d]) for r, d in zip(result, dtypes)]

        return as_tuple(tf.py_function(call, list(args), [DTYPES[d] for d in dtypes]))

    @staticmethod
    def eager(fn, args, dtypes):
        if tf.executing_eagerly():
            result = fn(*args)
            return result if isinstance(result, tuple) else (result,)

        def call(*values):
            result = fn(*values)
            result = result if isinstance(result, tuple) else (result,)
            return [tf.cast(r, DTYPES[d]) for r, d in zip(result, dtypes)]

        return as_tuple(tf.py_function(call, list(args), [DTYPES[d] for d in dtypes]))

    @staticmethod
    def numpy(fn, args, dtypes):
        def call(*values):
            result = fn(*values)
            result = result if isinstance(result, tuple) else (result,)
            return [np.ascontiguousarray(r, dtype=d) if np.ndim(r) else np.asarray(r, dtype=d)
                    for r, d in zip(result, dtypes)]

        return as_tuple(tf.numpy_function(call, list(args), [DTYPES[d] for d in dtypes]))

    @staticmethod
    def switch(index, branches):
        return tf.switch_case(index, branches)

    @staticmethod
    def building_graph():
        return not tf.executing_eagerly()

    @staticmethod
    def assertion(truth, data):
        return tf.debugging.Assert(truth, data)

    @staticmethod
    def after(ops, x):
        with tf.control_dependencies(ops):
            return tf.identity(x)

    @staticmethod
    def scope(name):
        return tf.name_scope(re.sub(r"[^A-Za-z0-9_.]", "_", name))

    def shared_state_read(self, method):
        """The method takes on module.method_state if a checkpoint restored it."""
        self.method_state.read(method)

    def shared_state_written(self, method):
        """Keep Method.shared_state() in module.method_state, the variable a tf.train.Checkpoint holds."""
        self.method_state.write(method)

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

    @staticmethod
    def fused_states(states):
        """None: a tf.Variable owns its storage (the caller concatenates the states' values)."""
        return None

    def imported_residual(self, name, values):
        """Made with its values, eagerly as residual() is (also while a tf.function is traced)."""
        variable = self.residual(name, int(np.size(values)))
        with tf.init_scope():
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
        """A sparse gradient sent dense stays dense (Horovod's sparse_as_dense in TensorFlow)."""
        if isinstance(flat, tf.IndexedSlices):  # allreduce_sparse's result
            item.result = flat
            return
        item.result = tf.cast(tf.reshape(flat, item.grad.shape), item.grad.dtype)
