"""What a parameter-space optimizer's statistics compare against (framework-free): every step, data-parallel SGD
would have allreduced the gradients, one value per parameter. The optimizers' own rounds are counted by
LeaderSync.account / ElasticSync.account."""
from horovod_ext.compression.wire import allreduce_wire_bytes


def account_dense_reference(stats, elements, param_bytes, nranks):
    """Add one step of data-parallel SGD's dense allreduce of `elements` gradients (`param_bytes` bytes)."""
    stats.add(elements=elements, dense_bytes=param_bytes, dense_wire_bytes=allreduce_wire_bytes(param_bytes, nranks))
