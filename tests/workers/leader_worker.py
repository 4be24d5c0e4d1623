"""Multi-process checks of LeaderOptimizer and ElasticAveragingOptimizer in PyTorch (run by horovodrun).

Every rank records what it observed; tests/test_leader.py asserts on every rank's record. Parameters are float64
and gradients zero where a check compares with the NumPy reference, so that only the pulls move them.
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import horovod_ext.torch as hvd  # noqa: E402
from hvdext_reference import lsgd as ref  # noqa: E402
from hvdrun import expect_error, write_result  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).double()


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def gathered(m, tag):
    return hvd.allgather(flat(m).reshape(1, -1), name=tag).numpy()


def zero_step(opt, m, loss):
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    opt.report_loss(loss)
    opt.step()


def losses_for(step):
    """Per-rank losses whose leaders differ between the groups and the world: rank SIZE-1 is best overall,
    and the second rank of each group is best in it (ties broken by the lowest rank are checked separately)."""
    return [10.0 - (r % 2) - 0.1 * r for r in range(SIZE)]


def check_pulls(groups):
    """One round with zero gradient: the result is the reference's convex combination of x and its leaders."""
    m = model(seed=100 + RANK)
    opt = hvd.LeaderOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), pull=0.2,
                              global_pull=0.1, period=1, global_period=1, groups=groups)
    before = gathered(m, f"before.{groups}")
    losses = losses_for(1)
    zero_step(opt, m, losses[RANK])
    after = gathered(m, f"after.{groups}")
    sync = opt._hx_sync
    out = {"groups": sync.groups, "leaders": sync.leaders, "best": sync.best_rank, "exact": [], "close": []}
    for r in range(SIZE):
        if groups is None:
            targets = [(0.2, before[ref.elect(losses, [1] * SIZE, list(range(SIZE)))])]
        else:
            members = next(g for g in sync.groups if r in g)
            targets = [(0.2, before[ref.elect(losses, [1] * SIZE, members)]),
                       (0.1, before[ref.elect(losses, [1] * SIZE, list(range(SIZE)))])]
        want = ref.leader_pull(before[r], targets)
        out["close"].append(bool(np.allclose(after[r], want, rtol=1e-13, atol=1e-15)))
        leader_of_all = all(np.array_equal(t, before[r]) for _, t in targets)
        if leader_of_all:  # a leader is not moved by its own pull
            out["exact"].append([r, bool(np.array_equal(after[r], before[r]))])
        if groups is None:  # one force: the distance to the leader shrinks by exactly (1 - pull)
            leader = targets[0][1]
            if not leader_of_all:
                ratio = np.linalg.norm(after[r] - leader) / np.linalg.norm(before[r] - leader)
                out.setdefault("ratios", []).append(float(ratio))
    # the broadcast handed every member the leader's bits: recompute this rank's pull in torch from the gathered
    # leader parameters with the same ops, and compare bit for bit
    if groups is None:
        leader = torch.from_numpy(before[sync.leaders["leader"]])
        mine = torch.from_numpy(before[RANK])
        out["bitwise"] = bool(torch.equal(mine + (leader - mine).mul_(0.2), flat(m)))
    # the leader's parameters, one call away
    with opt.evaluation_parameters():
        inside = gathered(m, f"eval.{groups}")
    out["evaluation_is_best"] = bool(all(np.array_equal(inside[r], after[sync.best_rank]) for r in range(SIZE)))
    out["restored"] = bool(np.array_equal(flat(m).numpy(), after[RANK]))
    return out


def check_tie_break():
    m = model(seed=7 + RANK)
    opt = hvd.LeaderOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), period=1, groups=None)
    zero_step(opt, m, 1.5)
    return opt._hx_sync.best_rank


def check_schedule():
    """period 2, global_period 4: elections at 2, 4, 6, 8; group broadcasts at each, global ones at 4 and 8."""
    m = model(seed=RANK)
    opt = hvd.LeaderOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), period=2,
                              global_period=4, groups="node")
    per_step = []
    for step in range(1, 9):
        zero_step(opt, m, 1.0 + RANK)
        per_step.append(opt.compression_stats()["last_step"]["payload_bytes"])
    param_bytes = sum(p.numel() * 8 for p in m.parameters())
    return {"payload_per_step": per_step, "param_bytes": param_bytes,
            "group_sizes": [len(g) for g in opt._hx_sync.groups]}


def batches(steps):
    gen = torch.Generator().manual_seed(RANK)
    return [(torch.randn(8, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (8,), generator=gen))
            for _ in range(steps)]


def check_independent_when_no_pull():
    """pull = global_pull = 0: every rank's parameters are those of plain local SGD, bit for bit."""
    data = batches(8)
    runs = []
    for wrap in (True, False):
        m = model(seed=RANK)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        if wrap:
            opt = hvd.LeaderOptimizer(opt, m.named_parameters(), pull=0.0, global_pull=0.0, period=2,
                                      global_period=4)
        for x, y in data:
            def closure():
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(m(x), y)
                loss.backward()
                return loss
            opt.step(closure)
        runs.append(flat(m))
    return bool(torch.equal(runs[0], runs[1]))


def check_state_dict():
    m = model(seed=RANK)
    opt = hvd.LeaderOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), period=2,
                              groups=None)
    for step in range(3):
        zero_step(opt, m, 2.0 - RANK)
    state = opt.state_dict()
    m2 = model(seed=RANK)
    opt2 = hvd.LeaderOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1), m2.named_parameters(), period=2,
                               groups=None)
    opt2.load_state_dict(state)
    return {"step": opt2._hx_state.step, "loss": opt2._hx_state.loss, "best": opt2._hx_sync.best_rank,
            "same": opt2._hx_sync.state() == opt._hx_sync.state()}


def check_easgd(rounds=4, beta=0.9):
    m = model(seed=RANK)  # different starting points: spread to shrink
    opt = hvd.ElasticAveragingOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), beta=beta,
                                        period=1)
    workers = gathered(m, "easgd.start")
    center = workers.mean(axis=0)
    spreads, center_errors, worker_errors = [], [], []
    for step in range(rounds):
        zero_step(opt, m, 1.0)
        if step == 0:
            # the first step sets the center to the workers' mean, then runs a round from it
            pass
        new_workers, center = ref.easgd_round(list(workers), center, beta)
        workers = gathered(m, f"easgd.{step}")
        worker_errors.append(float(np.max(np.abs(workers - np.array(new_workers)))))
        with opt.evaluation_parameters():
            center_now = flat(m).numpy()
        center_errors.append(float(np.max(np.abs(center_now - center))))
        spreads.append(float(np.linalg.norm(workers - workers.mean(axis=0))))
    state = opt.state_dict()["horovod_ext"]
    return {"spreads": spreads, "center_errors": center_errors, "worker_errors": worker_errors,
            "alpha": beta / SIZE, "center_in_state": state["center"] is not None}


def bad_inputs():
    def leader(**kwargs):
        m = model(seed=RANK)
        return hvd.LeaderOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), **kwargs)

    def run_steps(opt, losses):
        m_params = opt._hx_params
        for loss in losses:
            for p in m_params:
                p.grad = torch.zeros_like(p)
            if loss is not None:
                opt.report_loss(loss)
            opt.step()

    other = [[0, 1], [2, 3]] if SIZE == 4 else [[0], [1]]
    cases = [
        expect_error("pull_range", lambda: leader(pull=1.5)),
        expect_error("global_pull_negative", lambda: leader(global_pull=-0.1)),
        expect_error("pull_differs", lambda: leader(pull=0.1 if RANK == 0 else 0.2)),
        expect_error("bad_on_one_rank", lambda: leader(period=0 if RANK == SIZE - 1 else 4)),
        expect_error("global_period", lambda: leader(period=4, global_period=6)),
        expect_error("groups_overlap", lambda: leader(groups=[[0, 1], [1]] if SIZE == 2 else [[0, 1], [1, 2, 3]])),
        expect_error("groups_left_out", lambda: leader(groups=[[0]] if SIZE == 2 else [[0, 1], [2]])),
        expect_error("groups_differ", lambda: leader(groups=other if RANK == 0 else [list(range(SIZE))])),
        expect_error("groups_type", lambda: leader(groups="rack")),
        expect_error("beta", lambda: hvd.ElasticAveragingOptimizer(torch.optim.SGD(model(0).parameters(), lr=0.1),
                                                                    beta=1.0)),
        expect_error("nan_loss", lambda: run_steps(leader(period=2, groups=None),
                                                   [1.0, float("nan") if RANK == SIZE - 1 else 1.0])),
        expect_error("no_loss", lambda: run_steps(leader(period=2, groups=None), [None, None])),
    ]
    # after every error, the ranks still talk: one more collective completes
    alive = hvd.allreduce(torch.tensor([1.0]), name="alive", op=hvd.Sum).item()
    return {"cases": cases, "alive": alive}


if __name__ == "__main__":
    result = {"rank": RANK,
              "pulls_single": check_pulls(None),
              "pulls_node": check_pulls("node"),
              "tie_break": check_tie_break(),
              "schedule": check_schedule(),
              "independent": check_independent_when_no_pull(),
              "state_dict": check_state_dict(),
              "easgd": check_easgd(),
              "bad_inputs": bad_inputs()}
    hvd.allreduce(torch.tensor([0.0]), name="end")  # no rank leaves (and shuts Horovod down) before the others finish
    write_result(RANK, result)
