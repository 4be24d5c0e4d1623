"""DistributedGradientTape for TensorFlow 2.21 with Keras 3, where Horovod's own raises
`AttributeError: 'Variable' object has no attribute 'ref'` on Keras 3 variables."""
import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.process_sets import global_process_set

from .aggregator import GradientAggregator

_aggregators = {}


def aggregator_for(compression, op, process_set):
    """One aggregator (step counter, seed, settings check) per (compression, op, process set): a script that wraps a
    new tape every step continues one random key sequence. Compressor specs are hashable for this."""
    key = (compression, op, process_set.process_set_id)
    if key not in _aggregators:
        _aggregators[key] = GradientAggregator(compression, op, process_set,
                                               name=f"horovod_ext_tape_{len(_aggregators)}")
    return _aggregators[key]


class DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() computes the local gradients, then averages them across ranks with
    `compression` (hvd.Compression.none, fp16 by allreduce; ternary by allgather or two-phase).

    Use as with Horovod: ``tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.ternary)``.
    Everything else of the wrapped tape (watch, stop_recording, ...) is reached through this object.
    """

    def __init__(self, gradtape, compression=None, op=None, process_set=global_process_set, device_dense="",
                 device_sparse="", sparse_as_dense=True):
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
        self._tape = gradtape
        self.aggregator = aggregator_for(compression if compression is not None else hvd.Compression.none,
                                         op if op is not None else hvd.Average, process_set)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        flat = self.aggregator.aggregate(tf.nest.flatten(grads), tf.nest.flatten(sources))
        return tf.nest.pack_sequence_as(grads, flat)

    def compression_stats(self):
        return self.aggregator.compression_stats()

    def __getattr__(self, name):
        return getattr(self._tape, name)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)
