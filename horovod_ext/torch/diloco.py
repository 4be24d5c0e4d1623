"""DiLoCoOptimizer for PyTorch: H local steps of the wrapped optimizer, then an outer Nesterov step on the ranks'
averaged pseudo-gradients, sent through any compressor of the plan (horovod_ext/consensus/diloco.py has the math).

    opt = hvd.DiLoCoOptimizer(torch.optim.AdamW(model.parameters(), lr=4e-4), model.named_parameters(),
                              inner_steps=50, compression=hvd.Compression.ternary(error_feedback=True))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()   # every 50th step: the outer round
    with opt.evaluation_parameters():                                  # the outer parameters
        evaluate(model)

Every rank is a worker: its gradients are not averaged between rounds. The wrapped optimizer's state (AdamW's
moments, its learning-rate schedule) stays each rank's own across rounds, as in DiLoCo and its open
implementations. The outer parameters start as rank 0's parameters at the first step.
"""
import horovod.torch as hvd

from horovod_ext.torch_common.diloco import diloco_optimizer
from .collectives import HorovodCollectives


def DiLoCoOptimizer(optimizer, named_parameters=None, inner_steps=50, outer_lr=0.7, outer_momentum=0.9,
                    nesterov=True, compression=None, groups=None, inner_compression=None, fragments=1, overlap=0,
                    merge_alpha=0.0, outer="average"):
    """DiLoCo (Douillard et al. 2023) over Horovod: wrap a torch optimizer (the inner one, AdamW in the paper).

    Every worker takes ``inner_steps`` steps of its own optimizer on its own gradients; then the workers average
    their pseudo-gradients (outer parameters minus their own) through ``compression`` (any of hvd.Compression's:
    error feedback keeps what a compressor drops for the next round) and an outer SGD step with Nesterov
    momentum moves the outer parameters: b = mu b + Delta, theta -= outer_lr (Delta + mu b); every rank continues
    from theta.

    ``groups``: None, every rank is a worker; "node", the ranks of a host are one worker; or rank lists such as
    [[0, 1], [2, 3]]. A worker's ranks average their gradients at every inner step (an allreduce over the group,
    a Horovod process set, through ``inner_compression``) and its first rank alone sends at a round. Groups are
    process sets made after init: initialize with horovod_ext.torch.init() (or HOROVOD_DYNAMIC_PROCESS_SETS=1).

    Streaming DiLoCo (Douillard et al. 2025): ``fragments=P`` cuts the parameters into P fragments of whole
    layers (strided: layer j in fragment j mod P) synchronized in turn, one every inner_steps / P steps, so a
    sync sends 1/P of the model; ``overlap=tau`` (0 <= tau < inner_steps / P) starts a fragment's exchange tau
    inner steps before its outer update is applied (Horovod's handles stay in flight while the worker trains);
    ``merge_alpha``: the worker's fragment then becomes merge_alpha * its own + (1 - merge_alpha) * the outer
    one (0: the outer one, every replica identical). Each fragment has its own exchange state and residuals.

    ``outer="leader"`` (LSGD's leader as the outer step): at each exchange the worker with the lowest running
    training loss since the last one (one small allgather; ties to the lowest rank) alone sends its pseudo-gradient,
    through ``compression`` (none, fp16, ternary or topk), and the outer step follows it; with groups a worker's
    ranks average inside it and the best worker steers across. The loss: ``step(closure)`` or
    ``report_loss(loss)`` before ``step()``. ``outer="average"`` (the default) is DiLoCo's mean.

    Construction is collective: bad or differing arguments raise the same error on every rank."""
    none = hvd.Compression.none
    return diloco_optimizer(HorovodCollectives(), optimizer, named_parameters,
                            none if compression is None else compression,
                            none if inner_compression is None else inner_compression, inner_steps=inner_steps,
                            outer_lr=outer_lr, outer_momentum=outer_momentum, nesterov=nesterov, groups=groups,
                            fragments=fragments, overlap=overlap, merge_alpha=merge_alpha, outer=outer)
