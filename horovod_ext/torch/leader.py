"""LeaderOptimizer (LSGD, multi-leader LSGD) and ElasticAveragingOptimizer (EASGD) for PyTorch.

Both replace gradient averaging: every rank steps its own optimizer on its own gradient, and every `period` steps
the parameters are pulled toward a leader's (LSGD) or a center's (EASGD). The whole step (schedule, election,
pulls, EASGD's update, byte accounting, asynchronous rounds, evaluation) is horovod_ext.consensus's (step.py), and
the optimizer's API around it horovod_ext.torch_common's (parameter_sync.py); this module gives it Horovod's
collectives (collectives.py).

    opt = hvd.LeaderOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters())
    loss = opt.step(closure)                     # or: loss.backward(); opt.report_loss(loss); opt.step()
    with opt.evaluation_parameters():            # the best worker's parameters (EASGD: the center)
        evaluate(model); torch.save(model.state_dict(), path)

The pull is applied just before the local optimizer step, so the force and the gradient (already computed) both
come from the same x, as in the papers' update. For optimizers whose step reads the parameters (weight decay),
the decay term sees the pulled parameters.

With ``asynchronous=True`` the rounds' collectives are started with Horovod's ``*_async`` and waited for
``max_staleness`` steps later (horovod_ext/consensus/rounds.py has the schedule): Horovod's background thread
moves the parameters while this rank keeps stepping. ``state_dict()`` waits for what is in flight and saves it
with its due step, so a rank that resumes from its own checkpoint continues bit for bit.
"""
from horovod_ext.torch_common.parameter_sync import ElasticSyncOptimizer, LeaderSyncOptimizer, sync_optimizer
from .collectives import HorovodCollectives


def LeaderOptimizer(optimizer, named_parameters=None, pull=0.1, global_pull=0.1, period=4, global_period=16,
                    groups="node", asynchronous=False, max_staleness=None):
    """Leader SGD (LSGD, Teng et al. 2019) over Horovod: wrap a torch optimizer.

    Every rank steps on its own gradient (no gradient averaging). Every ``period`` steps the ranks elect leaders
    (lowest running-average training loss since the last election, ties to the lowest rank) and each rank is
    pulled toward its group's leader with weight ``pull``; every ``global_period`` steps (a multiple of
    ``period``) also toward the global leader with ``global_pull``:
    x <- x - lr*g - pull*(x - x_group_leader) - global_pull*(x - x_global_leader).

    groups: "node" (one group per host: Horovod's local ranks), explicit rank lists such as [[0, 1], [2, 3]],
    or None for single-leader LSGD (all ranks follow one leader every ``period`` steps with ``pull``;
    ``global_pull`` and ``global_period`` unused). Groups are Horovod process sets, made here; initialize with
    ``horovod_ext.torch.init()``, which enables Horovod's dynamic process sets. pull = global_pull = 0 is
    independent SGD. The training loss comes from ``step(closure)`` or ``report_loss(loss)`` before ``step()``.
    Construction is collective: bad or differing arguments raise the same error on every rank.

    asynchronous=True hides the communication behind local steps: the losses exchanged at an election step s are
    read at s + 1, where the leaders' broadcasts start, and the pull is applied at s + 1 + max_staleness with the
    leaders' parameters of step s + 1 and the force taken at the step it is applied:
    x_a <- x_a - lr*g_a - pull*(x_a - x_L[s+1]) - global_pull*(x_a - x_G[s+1]); a rank takes no pull toward
    itself. max_staleness (default period - 1, at least 1) bounds the lag: a transfer not complete by then is
    waited for. Every rank applies the same schedule; max_staleness=0 is the synchronous optimizer.
    """
    return sync_optimizer(LeaderSyncOptimizer, HorovodCollectives(), optimizer, named_parameters, pull=pull,
                          global_pull=global_pull, period=period, global_period=global_period, groups=groups,
                          asynchronous=asynchronous, max_staleness=max_staleness)


def ElasticAveragingOptimizer(optimizer, named_parameters=None, beta=0.9, period=4, asynchronous=False,
                              max_staleness=None):
    """Synchronous Elastic Averaging SGD (EASGD, Zhang et al. 2015) over Horovod: wrap a torch optimizer.

    Every rank steps on its own gradient; every ``period`` steps one allreduce gives the workers' mean and
    center <- (1-beta)*center + beta*mean, x_i <- x_i - (beta/p)*(x_i - center_old). The center starts at the
    workers' parameters at the first step; evaluate and save it with ``evaluation_parameters()``.

    asynchronous=True: the allreduce of x_s starts at step s and is applied at a = s + max_staleness (default
    period - 1, at least 1): center <- (1-beta)*center + beta*mean(x[s]), x_a <- x_a - (beta/p)*(x_a - center_old).
    """
    return sync_optimizer(ElasticSyncOptimizer, HorovodCollectives(), optimizer, named_parameters, beta=beta,
                          period=period, asynchronous=asynchronous, max_staleness=max_staleness)
