"""horovod_ext.ddp: horovod-ext's methods over torch.distributed, with no Horovod (the third adapter, beside
horovod_ext.torch and horovod_ext.tensorflow), for DistributedDataParallel models under torchrun:

    import horovod_ext.ddp as hx
    state = hx.CompressionState(hx.Compression.ternary, named_parameters=model.named_parameters())
    model.register_comm_hook(state, hx.comm_hook)

hook.py is the communication hook, backend.py the plan's backend over a process group, compression.py the
compressors, leader.py LSGD and EASGD and diloco.py DiLoCo for plain models; the framework-free core
(compression/, compressors/, consensus/) and torch_common/ do the rest (docs/ddp.md)."""
from .compression import Compression
from .diloco import DiLoCoOptimizer
from .hook import CompressionState, comm_hook
from .leader import ElasticAveragingOptimizer, LeaderOptimizer

__all__ = ["Compression", "CompressionState", "DiLoCoOptimizer", "ElasticAveragingOptimizer", "LeaderOptimizer",
           "comm_hook"]
