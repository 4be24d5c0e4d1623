"""Horovod's broadcast_optimizer_state, extended to horovod_ext's DistributedOptimizer.

Horovod's resume pattern: rank 0 loads a checkpoint, then every rank calls ``broadcast_parameters`` and
``broadcast_optimizer_state(optimizer, root_rank=0)``. On a rank whose optimizer has no state yet, Horovod creates it
by one step of the wrapped optimizer on zero gradients, without any collective. Additions here:
- that step is the wrapped optimizer's own for every horovod_ext optimizer (Horovod recognizes only its own
  DistributedOptimizer; a LeaderOptimizer's step would advance its schedule on the fresh ranks alone);
- horovod_ext's shared state (DistributedOptimizer: step counter, seed, statistics, GraVAC controller, see
  horovod_ext.compression.resume; LeaderOptimizer / ElasticAveragingOptimizer: the schedule, leaders, center) is
  broadcast from root_rank too, so every rank continues the same random key sequence and the same schedule;
- the parameters are restored after that state-creating step, so weight decay applied to the zero gradient (SGD's
  ``weight_decay``, AdamW) cannot move the non-root ranks' parameters away from the ones just broadcast.
"""
import torch
from horovod.torch.functions import broadcast_optimizer_state as horovod_broadcast_optimizer_state


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Broadcast ``optimizer``'s state from ``root_rank`` to every rank (Horovod's signature and behaviour), with
    horovod_ext's compressor state for its DistributedOptimizer."""
    fresh = len(optimizer.state) == 0
    saved = [(p, p.detach().clone()) for group in optimizer.param_groups for p in group["params"]] if fresh else []
    base_step = getattr(optimizer, "_hx_base_step", None)
    if base_step is not None:
        optimizer.step = base_step  # Horovod's optimizer.step() call below reaches the wrapped optimizer alone
    try:
        horovod_broadcast_optimizer_state(optimizer, root_rank, model=model)
    finally:
        if base_step is not None:
            del optimizer.step
    with torch.no_grad():
        for p, value in saved:
            p.copy_(value)
    broadcast_ours = getattr(optimizer, "_hx_broadcast_state", None)
    if broadcast_ours is not None:
        broadcast_ours(root_rank)
