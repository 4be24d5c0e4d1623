"""DiLoCoOptimizer over torch.distributed, for plain (not DistributedDataParallel-wrapped) models under torchrun:
horovod_ext.torch.DiLoCoOptimizer's outer loop, arguments, checkpoints and errors (torch_common/diloco.py), with
the fragments' exchanges through the plan's torch.distributed backend (backend.py) and the workers' groups as
torch.distributed groups (docs/ddp.md).

    dist.init_process_group("gloo")
    opt = hx.DiLoCoOptimizer(torch.optim.AdamW(model.parameters(), lr=4e-4), model.named_parameters(),
                             inner_steps=50, compression=hx.Compression.ternary(error_feedback=True))
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()   # every 50th step: the outer round
"""
from horovod_ext.torch_common.diloco import diloco_optimizer
from .collectives import DistCollectives
from .compression import Compression


def DiLoCoOptimizer(optimizer, named_parameters=None, inner_steps=50, outer_lr=0.7, outer_momentum=0.9,
                    nesterov=True, compression=None, groups=None, inner_compression=None, fragments=1, overlap=0,
                    merge_alpha=0.0, outer="average"):
    """DiLoCo (Douillard et al. 2023) over torch.distributed: horovod_ext.torch.DiLoCoOptimizer's math and
    arguments (docs/optimizers.md): ``inner_steps`` steps of the wrapped optimizer, then the workers' pseudo-gradients
    averaged through ``compression`` (any hx.Compression) and an outer Nesterov step; ``groups`` (None, "node" or
    rank lists) as torch.distributed groups, ``fragments``/``overlap``/``merge_alpha`` (streaming DiLoCo) and
    ``outer="leader"`` as there. Call after dist.init_process_group; construction is collective."""
    none = Compression.none
    return diloco_optimizer(DistCollectives(), optimizer, named_parameters,
                            none if compression is None else compression,
                            none if inner_compression is None else inner_compression, inner_steps=inner_steps,
                            outer_lr=outer_lr, outer_momentum=outer_momentum, nesterov=nesterov, groups=groups,
                            fragments=fragments, overlap=overlap, merge_alpha=merge_alpha, outer=outer)
