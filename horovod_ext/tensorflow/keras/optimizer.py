"""DistributedOptimizer for Keras 3 optimizers: averages gradients across ranks (with compression) in apply(),
which both model.fit (through apply_gradients) and custom loops call. Horovod 0.28.1's full signature, gradient
accumulation over ``backward_passes_per_step`` included."""
import keras
import tensorflow as tf
from horovod.common.process_sets import global_process_set
from horovod.tensorflow.mpi_ops import Average

from horovod_ext.compression.horovod_args import check_groups
from horovod_ext.tensorflow.optimizer import GradientAggregator

_counter = [0]


class LocalAccumulation(tf.Module):
    """Gradient accumulation as Horovod's LocalGradientAggregationHelper does it: apply() sums each gradient into a
    local accumulator; every ``passes``-th call the accumulated gradient (divided by ``passes`` if
    ``average_aggregated_gradients``) is aggregated across ranks once, so a compressor sees one gradient per real
    step, and applied; the other calls only count the optimizer's iteration. With averaging, two passes over two
    halves of a batch apply the gradient of the whole batch."""

    def __init__(self, passes, average):
        super().__init__(name="horovod_ext_accumulation")
        self.passes, self.average = int(passes), bool(average)
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="counter")
        self.sums = None

    def build(self, variables):
        if self.sums is None:
            with tf.init_scope():
                self.sums = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="accumulated")
                             for v in variables]

    def add(self, grads):
        return [s.assign_add(tf.convert_to_tensor(g)) for s, g in zip(self.sums, grads) if g is not None]

    def take(self, grads):
        """The accumulated gradients (None where the pass gave None)."""
        return [None if g is None else (s.read_value() / self.passes if self.average else s.read_value())
                for s, g in zip(self.sums, grads)]

    def reset(self):
        return tf.group(*[s.assign(tf.zeros_like(s)) for s in self.sums])


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=None,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True, bucket_cap_mb=25):
    """Wrap a Keras 3 optimizer (keras.optimizers.SGD, Adam, ...) for data-parallel training with Horovod.

    Returns an optimizer of the same class and configuration whose apply()/apply_gradients() first average the
    gradients across ranks with ``compression`` (hvd.Compression.none, fp16, ternary, topk, adaptive_topk). The
    signature is Horovod 0.28.1's: ``backward_passes_per_step`` > 1 accumulates gradients locally (summed, or
    averaged with ``average_aggregated_gradients``) and communicates and applies them every that many calls;
    ``sparse_as_dense``, ``gradient_predivide_factor``, ``device_dense``/``device_sparse``, ``scale_local_gradients``
    (with ``register_local_var``) have Horovod's meaning; ``num_groups``/``groups`` (explicit grouping) are refused
    with an error that says what to do; ``bucket_cap_mb`` (horovod-ext's, default 25) fuses a payload compressor's
    per-tensor collectives into one per bucket (see GradientAggregator). ``compression_stats()`` reports bytes per
    step, and ``optimizer.horovod_ext`` holds the step counter, seed and compressor state as tf.Variables
    (tf.train.Checkpoint(horovod_ext=optimizer.horovod_ext)).
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        module = type(optimizer).__module__
        raise TypeError(
            f"DistributedOptimizer needs a Keras 3 optimizer (keras.optimizers.SGD, Adam, ...); got "
            f"{module}.{type(optimizer).__name__}" + (" from tf_keras / Keras 2" if "keras" in module else "")
            + ". Create it with `import keras; keras.optimizers.SGD(...)`.")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}")
    check_groups(num_groups, groups)
    _counter[0] += 1
    aggregator = GradientAggregator(compression, op, process_set, name=name or f"horovod_ext_keras_{_counter[0]}",
                                    sparse_as_dense=sparse_as_dense,
                                    gradient_predivide_factor=gradient_predivide_factor, device_dense=device_dense,
                                    device_sparse=device_sparse, scale_local_gradients=scale_local_gradients,
                                    bucket_cap_mb=bucket_cap_mb)
    accumulation = LocalAccumulation(backward_passes_per_step, average_aggregated_gradients) \
        if backward_passes_per_step > 1 else None
    base = optimizer.__class__

    def communicate_and_apply(self, grads, variables):
        grads = self.horovod_ext.aggregate(list(grads), variables)
        return base.apply(self, grads, variables)

    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables) if trainable_variables is not None else list(self._trainable_variables)
        grads = list(grads)
        if accumulation is None:
            return communicate_and_apply(self, grads, variables)
        if not self.built:
            with tf.init_scope():
                self.build(variables)
        accumulation.build(variables)
        with tf.control_dependencies(accumulation.add(grads)):
            count = accumulation.counter.assign_add(1)
        ready = tf.equal(count % accumulation.passes, 0)

        def apply_accumulated():
            communicate_and_apply(self, accumulation.take(grads), variables)
            return accumulation.reset()  # after the reads above (program order of stateful ops)

        def count_iteration():  # as Horovod: a pass that only accumulates still counts an iteration
            return tf.group(self.iterations.assign_add(1))

        if tf.executing_eagerly():
            apply_accumulated() if bool(ready) else count_iteration()
            return None
        tf.cond(ready, apply_accumulated, count_iteration)
        return None

    def compression_stats(self):
        return self.horovod_ext.compression_stats()

    def register_local_var(self, var):
        """Horovod's: this variable's gradient is not communicated (divided by the number of ranks if
        scale_local_gradients)."""
        self.horovod_ext.register_local_var(var)

    cls = type(base.__name__, (base,), {"apply": apply, "compression_stats": compression_stats,
                                        "register_local_var": register_local_var})
    wrapped = cls.from_config(optimizer.get_config())
    object.__setattr__(wrapped, "horovod_ext", aggregator)  # not a Keras-tracked attribute
    object.__setattr__(wrapped, "horovod_ext_accumulation", accumulation)
    return wrapped
