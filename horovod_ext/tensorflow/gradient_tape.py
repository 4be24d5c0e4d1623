"""DistributedGradientTape for TensorFlow 2.21 with Keras 3, where Horovod's own raises
`AttributeError: 'Variable' object has no attribute 'ref'` on Keras 3 variables."""
import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.process_sets import global_process_set

from horovod_ext.compression.buckets import check_bucket_cap_mb
from horovod_ext.compression.horovod_args import check_groups

from .optimizer import GradientAggregator

_aggregators = {}


def aggregator_for(compression, op, process_set, **options):
    """One aggregator (step counter, seed, settings check) per (compression, op, process set, Horovod options): a
    script that wraps a new tape every step continues one random key sequence. Compressor specs are hashable."""
    key = (compression, op, process_set.process_set_id, tuple(sorted(options.items())))
    if key not in _aggregators:
        _aggregators[key] = GradientAggregator(compression, op, process_set,
                                               name=f"horovod_ext_tape_{len(_aggregators)}", **options)
    return _aggregators[key]


class DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() computes the local gradients, then averages them across ranks with
    `compression` (hvd.Compression.none, fp16 by allreduce; ternary, topk, adaptive_topk by their transports).

    Use as with Horovod: ``tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.ternary)``. The
    signature is Horovod 0.28.1's; ``sparse_as_dense``, ``gradient_predivide_factor``, ``device_dense``,
    ``device_sparse`` and ``scale_local_gradients`` have Horovod's meaning (see GradientAggregator); ``num_groups``
    and ``groups`` (explicit grouping) are refused with an error that says what to do (tensor fusion batches here);
    ``bucket_cap_mb`` (horovod-ext's, default 25) fuses a payload compressor's per-tensor collectives into one per
    bucket (see GradientAggregator).
    Everything else of the wrapped tape (watch, stop_recording, ...) is reached through this object.
    """

    def __init__(self, gradtape, device_dense="", device_sparse="", compression=None, sparse_as_dense=False,
                 op=None, gradient_predivide_factor=1.0, num_groups=0, groups=None, process_set=global_process_set,
                 scale_local_gradients=True, bucket_cap_mb=25):
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
        check_groups(num_groups, groups)
        self._tape = gradtape
        self.aggregator = aggregator_for(compression if compression is not None else hvd.Compression.none,
                                         op if op is not None else hvd.Average, process_set,
                                         sparse_as_dense=bool(sparse_as_dense),
                                         gradient_predivide_factor=gradient_predivide_factor,
                                         device_dense=device_dense, device_sparse=device_sparse,
                                         scale_local_gradients=bool(scale_local_gradients),
                                         bucket_cap_mb=check_bucket_cap_mb(bucket_cap_mb, "DistributedGradientTape"))

    def register_local_source(self, source):
        """Horovod's: the gradient of this source is not communicated (divided by the number of ranks if
        scale_local_gradients)."""
        self.aggregator.register_local_var(source)

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
