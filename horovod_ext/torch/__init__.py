"""horovod_ext.torch: a superset of horovod.torch.

``import horovod_ext.torch as hvd`` keeps everything of ``horovod.torch`` (rank, allreduce, broadcast_parameters,
...) and replaces ``Compression`` (adds ternary, topk, adaptive_topk), ``DistributedOptimizer`` (carries payload
compressors by allgather, reports ``compression_stats()``, keeps its state in ``state_dict()``), ``init``
(enables dynamic process sets), ``broadcast_optimizer_state`` (also broadcasts the compressor's state) and
``elastic`` (Horovod's elastic training with horovod_ext's optimizers in the state), and
adds the parameter-space optimizers ``LeaderOptimizer`` (LSGD) and ``ElasticAveragingOptimizer`` (EASGD), and
``project`` (this job's step time at other scales and links, by horovod_ext.perfmodel).
"""
import horovod.torch as _horovod
from horovod.torch import *  # noqa: F401,F403  (everything of horovod.torch is still there)

from horovod_ext.consensus.init import make_init  # noqa: E402
from horovod_ext.horovod_internals import framework_basics  # noqa: E402
import importlib  # noqa: E402
from .compression import Compression  # noqa: E402,F401  (re-exported)
from .functions import broadcast_optimizer_state  # noqa: E402,F401  (re-exported)
from .project import project  # noqa: E402,F401  (re-exported)
from .diloco import DiLoCoOptimizer  # noqa: E402,F401  (re-exported)
from .leader import ElasticAveragingOptimizer, LeaderOptimizer  # noqa: E402,F401  (re-exported)
from .optimizer import DistributedOptimizer, complete_in_flight as _complete_in_flight  # noqa: E402,F401  (re-exported)

# horovod.torch.elastic's names with horovod_ext's optimizers in the state; `from . import elastic` would return
# the `elastic` the star import bound (Horovod's).
elastic = importlib.import_module(".elastic", __name__)
init = make_init(_horovod.init, framework_basics(_horovod))


_horovod_join = _horovod.join  # Horovod's own (under horovod_ext.run, horovod.torch.join becomes the one below)


def join(device=-1):
    """horovod.torch.join(device), once every DistributedOptimizer has taken in what its last step left in flight
    (optimizer.complete_in_flight). Returns the id of the rank that joined last."""
    _complete_in_flight()
    return _horovod_join(device)
