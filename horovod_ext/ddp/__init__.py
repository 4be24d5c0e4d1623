"""horovod_ext.ddp: horovod-ext's methods over torch.distributed, with no Horovod (the third adapter, beside
horovod_ext.torch and horovod_ext.tensorflow), for DistributedDataParallel models under torchrun:

    import horovod_ext.ddp as hx
    state = hx.CompressionState(hx.Compression.ternary, named_parameters=model.named_parameters())
    model.register_comm_hook(state, hx.comm_hook)

hook.py is the communication hook, backend.py the plan's backend over a process group, compression.py the
compressors; the framework-free core (compression/, compressors/, consensus/) and torch_common/ do the rest
(docs/ddp.md)."""
from .compression import Compression
from .hook import CompressionState, comm_hook

__all__ = ["Compression", "CompressionState", "comm_hook"]
