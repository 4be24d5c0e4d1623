"""LeaderOptimizer (LSGD, multi-leader LSGD) and ElasticAveragingOptimizer (EASGD) over torch.distributed, for
plain (not DistributedDataParallel-wrapped) models under torchrun: the same step (consensus/step.py), API and
checkpoints as horovod_ext.torch's (torch_common/parameter_sync.py), on the default process group, with LSGD's
groups as torch.distributed groups. The math and every argument are horovod_ext.torch.LeaderOptimizer's and
ElasticAveragingOptimizer's (docs/optimizers.md).

    dist.init_process_group("gloo")
    opt = hx.LeaderOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters())
    loss = opt.step(closure)                     # or: loss.backward(); opt.report_loss(loss); opt.step()"""
from horovod_ext.torch_common.parameter_sync import ElasticSyncOptimizer, LeaderSyncOptimizer, sync_optimizer
from .collectives import DistCollectives


def LeaderOptimizer(optimizer, named_parameters=None, pull=0.1, global_pull=0.1, period=4, global_period=16,
                    groups="node", asynchronous=False, max_staleness=None):
    """Leader SGD (LSGD, Teng et al. 2019) over torch.distributed: horovod_ext.torch.LeaderOptimizer's step and
    arguments (x <- x - lr*g - pull*(x - x_group_leader) - global_pull*(x - x_global_leader)). groups: "node" (the
    ranks of one host), explicit rank lists, or None (one leader); groups are torch.distributed groups, made here
    on every rank. Call after dist.init_process_group; construction is collective."""
    return sync_optimizer(LeaderSyncOptimizer, DistCollectives(), optimizer, named_parameters, pull=pull,
                          global_pull=global_pull, period=period, global_period=global_period, groups=groups,
                          asynchronous=asynchronous, max_staleness=max_staleness)


def ElasticAveragingOptimizer(optimizer, named_parameters=None, beta=0.9, period=4, asynchronous=False,
                              max_staleness=None):
    """Synchronous Elastic Averaging SGD (EASGD, Zhang et al. 2015) over torch.distributed:
    horovod_ext.torch.ElasticAveragingOptimizer's step and arguments (every ``period`` steps center <-
    (1-beta)*center + beta*mean, x_i <- x_i - (beta/p)*(x_i - center_old))."""
    return sync_optimizer(ElasticSyncOptimizer, DistCollectives(), optimizer, named_parameters, beta=beta,
                          period=period, asynchronous=asynchronous, max_staleness=max_staleness)
