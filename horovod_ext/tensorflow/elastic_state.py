"""What horovod_ext's Keras optimizers hold across an elastic reset, in one shape (keras/elastic.py's KerasState
calls it for whichever it finds in ``optimizer.horovod_ext``: DistributedOptimizer's aggregator, or
LeaderOptimizer's / ElasticAveragingOptimizer's state):

- ``elastic_commit()`` -> this rank's copy of its state (NumPy values), taken at every commit;
- ``elastic_restore(saved)``: back to a commit, after a failure;
- ``elastic_reset()``: after Horovod's shutdown and init, rebuilt for the new membership;
- ``elastic_sync()``: collective, after every reset: the part every rank holds alike from rank 0 (a rank the reset
  added has no state of its own yet); the part that is each rank's own stays.
"""
import tensorflow as tf
from horovod.tensorflow.mpi_ops import broadcast


def broadcast_variables(variables, tag):
    """Assign rank 0's value of each variable on every rank (one broadcast each, named by `tag`)."""
    for i, v in enumerate(variables):
        v.assign(broadcast(tf.convert_to_tensor(v), 0, name=f"hvdext.elastic.{tag}.{i}", ignore_name_scope=True))


def assign_all(variables, values):
    for v, value in zip(variables, values):
        v.assign(value)


def numpy_values(variables):
    return [v.numpy() for v in variables]
