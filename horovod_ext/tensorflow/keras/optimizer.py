"""DistributedOptimizer for Keras 3 optimizers: averages gradients across ranks (with compression) in apply(),
which both model.fit (through apply_gradients) and custom loops call."""
import keras
from horovod.common.process_sets import global_process_set

from horovod_ext.tensorflow.aggregator import GradientAggregator

_counter = [0]


def DistributedOptimizer(optimizer, compression=None, op=None, process_set=global_process_set, name=None):
    """Wrap a Keras 3 optimizer (keras.optimizers.SGD, Adam, ...) for data-parallel training with Horovod.

    Returns an optimizer of the same class and configuration whose apply()/apply_gradients() first average the
    gradients across ranks with ``compression`` (hvd.Compression.none, fp16, ternary). Its compression_stats()
    reports bytes per step, and ``optimizer.horovod_ext`` holds the step counter and seed as tf.Variables
    (checkpoint it with tf.train.Checkpoint(horovod_ext=optimizer.horovod_ext)).
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        module = type(optimizer).__module__
        raise TypeError(
            f"DistributedOptimizer needs a Keras 3 optimizer (keras.optimizers.SGD, Adam, ...); got "
            f"{module}.{type(optimizer).__name__}" + (" from tf_keras / Keras 2" if "keras" in module else "")
            + ". Create it with `import keras; keras.optimizers.SGD(...)`.")
    _counter[0] += 1
    aggregator = GradientAggregator(compression, op, process_set, name=name or f"horovod_ext_keras_{_counter[0]}")
    base = optimizer.__class__

    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables) if trainable_variables is not None else list(self._trainable_variables)
        grads = self.horovod_ext.aggregate(list(grads), variables)
        return base.apply(self, grads, trainable_variables)

    def compression_stats(self):
        return self.horovod_ext.compression_stats()

    cls = type(base.__name__, (base,), {"apply": apply, "compression_stats": compression_stats})
    wrapped = cls.from_config(optimizer.get_config())
    object.__setattr__(wrapped, "horovod_ext", aggregator)  # not a Keras-tracked attribute
    return wrapped
