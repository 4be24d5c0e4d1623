"""What a user would pick instead of horovod-ext: PyTorch DDP over Gloo with its fp16-compression and PowerSGD
communication hooks, for the link and time-to-accuracy workers (run under horovodrun, which gives rank and size).

DDP runs with one bucket (bucket_cap_mb=200): with DDP's default 25 MB buckets the PowerSGD hook over Gloo failed on
a shaped link ("Received data size doesn't match expected size", seen on this 2-core machine).
"""
import os

import torch

from horovod_ext.compression.wire import allreduce_wire_bytes
from horovod_ext.perfmodel import plan

DDP_METHODS = ("ddp", "ddp-fp16", "powersgd", "powersgd-r1", "powersgd-r2")  # powersgd: the hook at rank 4


def ddp_wrap(model, method, rank, size, port=29533):
    """model wrapped in DistributedDataParallel with the method's hook, and (payload, wire) bytes per step."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as powersgd

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=size)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=200)
    dense = 4 * sum(p.numel() for p in model.parameters())
    if method == "ddp-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        payload = dense // 2
    elif method.startswith("powersgd"):
        rank = int(method.partition("-r")[2] or 4)
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
        payload = powersgd_bytes(model, rank)
    else:
        payload = dense
    return ddp, payload, allreduce_wire_bytes(payload, size)


def powersgd_bytes(model, rank, min_compression_rate=2):
    """The bytes PowerSGD's hook allreduces per step for `model` (horovod_ext.perfmodel's plan, the one count)."""
    transfers = plan("powersgd", [tuple(p.shape) for p in model.parameters()], 1, rank=rank,
                     min_compression_rate=min_compression_rate, hook=True)
    return sum(t.payload for t in transfers)
