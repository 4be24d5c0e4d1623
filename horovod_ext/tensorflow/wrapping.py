"""How the Keras 3 parameter-space optimizers (LeaderOptimizer, ElasticAveragingOptimizer, DiLoCoOptimizer) wrap a
Keras optimizer: checked to be one, with their named variables' layout for the ranks to compare, and remade as a
subclass of its own class with the adapter's methods and its state (a tf.Module) at ``optimizer.horovod_ext``."""
import keras
import tensorflow as tf

from horovod_ext.compression.horovod_args import check_named_parameters


def checked_named_tensors(optimizer, named_parameters, what):
    """(named (name, variable) pairs, their (name, shape, dtype) for the settings exchange); TypeError unless
    `optimizer` is a Keras 3 optimizer."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"{what} needs a Keras 3 optimizer (keras.optimizers.SGD, Adam, ...); got "
                        f"{type(optimizer).__module__}.{type(optimizer).__name__}")
    check_named_parameters(named_parameters, None, what)  # the Keras optimizer is not built yet
    named = list(named_parameters) if named_parameters is not None else []
    return named, [(n, tuple(v.shape), tf.as_dtype(v.dtype).name) for n, v in named]


def wrap(optimizer, methods, state):
    """A new optimizer of a subclass of optimizer's class with `methods`, the same configuration, and `state` at
    ``.horovod_ext`` (not a Keras-tracked attribute)."""
    base = optimizer.__class__
    cls = type(base.__name__, (base,), methods)
    wrapped = cls.from_config(optimizer.get_config())
    object.__setattr__(wrapped, "horovod_ext", state)
    return wrapped
