"""Multi-process checks of asynchronous LeaderOptimizer and ElasticAveragingOptimizer in PyTorch (run by horovodrun).

Every rank records, step by step, every rank's parameters before and after the step (float64, zero gradients, so
that only the pulls move them at a step; between steps each rank moves its parameters by its own noise, standing
in for local progress) and how long its step() took. tests/test_async_leader.py replays the schedule with the
NumPy reference. Parameter transfers are slowed by an injected latency (slow_transfers).
"""
import io
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import horovod_ext.torch as hvd  # noqa: E402
from hvdrun import expect_error, write_result  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)
DELAY = 1.0  # seconds of injected latency on every parameter transfer


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).double()


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


_tags = iter(range(10 ** 6))


def gathered(m):
    return hvd.allgather(flat(m).reshape(1, -1), name=f"check.{next(_tags)}").numpy()


def loss_at(step, rank):
    """Losses whose best rank changes every 4 steps, so that successive rounds elect different leaders."""
    return 10.0 - 0.5 * ((rank + step // 4) % SIZE) + 0.01 * rank


def nudge(m, rng):
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.from_numpy(rng.normal(scale=0.01, size=tuple(p.shape))))


def record_run(opt, m, steps, seed, center=None):
    rng = np.random.default_rng(1000 * seed + RANK)
    out = {"xs": [], "after": [], "losses": [], "seconds": [], "starts": [], "centers": []}
    WAITS.clear()
    for k in range(1, steps + 1):
        STEP[0] = k
        out["xs"].append(gathered(m).tolist())
        loss = loss_at(k, RANK)
        out["losses"].append(hvd.allgather(torch.tensor([loss], dtype=torch.float64), name=f"check.{next(_tags)}")
                             .tolist())
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
        opt.report_loss(loss)
        start = time.perf_counter()
        opt.step()
        out["seconds"].append(time.perf_counter() - start)
        out["starts"].append(start)
        out["after"].append(gathered(m).tolist())
        if center is not None:
            out["centers"].append(torch.cat([c.reshape(-1) for c in opt._hx_state.center_values]).tolist())
        nudge(m, rng)
    out["waits"] = list(WAITS)
    return out


STEP = [0]  # the step record_run is taking
WAITS = []  # (the step a slowed transfer started at, the step it was first waited for)


class SlowTransfer:
    """A parameter transfer whose results are handed out no sooner than `delay` seconds after it started, as if a
    slow link had held them that long; the steps it started and was first waited at are logged in WAITS."""

    def __init__(self, transfer, delay):
        self.transfer, self.ready_at, self.started, self.waited = transfer, time.perf_counter() + delay, STEP[0], False

    def wait(self):
        if not self.waited:
            WAITS.append((self.started, STEP[0]))
            self.waited = True
        time.sleep(max(0.0, self.ready_at - time.perf_counter()))
        return self.transfer.wait()


def slow_transfers(opt, delay):
    """Every parameter transfer of opt (the leaders' broadcasts, EASGD's averages) slowed by `delay` seconds."""
    be = opt._hx_be
    for collective in ("broadcast", "allreduce_mean"):
        def slowed(*args, start=getattr(be, collective), **kwargs):
            return SlowTransfer(start(*args, **kwargs), delay)
        setattr(be, collective, slowed)


def leader_schedule(groups, period, global_period, staleness, delay, steps, seed):
    m = model(seed=seed + RANK)
    opt = hvd.LeaderOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), pull=0.2,
                              global_pull=0.1, period=period, global_period=global_period, groups=groups,
                              asynchronous=True, max_staleness=staleness)
    slow_transfers(opt, delay)
    out = record_run(opt, m, steps, seed)
    mine = [[level.name, level.members, level.period, level.weight] for level in opt._hx_sync.levels]
    out["levels"] = hvd.allgather_object(mine, name=f"check.{next(_tags)}")
    out["staleness"] = opt.compression_stats()["staleness"]
    return out


def easgd_schedule(period, staleness, delay, steps, seed, beta=0.5):
    m = model(seed=seed + RANK)
    opt = hvd.ElasticAveragingOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), beta=beta,
                                        period=period, asynchronous=True, max_staleness=staleness)
    slow_transfers(opt, delay)
    out = record_run(opt, m, steps, seed, center=True)
    out.update(alpha=opt._hx_sync.alpha, beta=beta)
    return out


def batches(step):
    g = torch.Generator().manual_seed(100 * step + RANK)
    return torch.randn(8, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (8,), generator=g)


def train_step(opt, m, step):
    x, y = batches(step)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward()
    opt.report_loss(loss)
    opt.step()


def lockstep(make_a, make_b, steps, seed, save_at=None):
    """Two optimizers on two copies of one model, trained on the same batches step by step. With save_at, b is
    instead built at step save_at from a's state_dict() (through torch.save) and a copy of a's model."""
    ma, mb = model(seed + RANK), model(seed + RANK)
    a = make_a(ma)
    b = make_b(mb) if save_at is None else None
    for k in range(1, steps + 1):
        train_step(a, ma, k)
        if b is not None:
            train_step(b, mb, k)
        if k == save_at:
            buffer = io.BytesIO()
            torch.save({"model": ma.state_dict(), "opt": a.state_dict()}, buffer)
            buffer.seek(0)
            saved = torch.load(buffer, weights_only=False)
            mb.load_state_dict(saved["model"])
            b = make_b(mb)
            b.load_state_dict(saved["opt"])
            b.in_flight_at_save = len(saved["opt"]["horovod_ext"]["rounds"])
    return {"equal": bool(torch.equal(flat(ma), flat(mb))),
            "in_flight_at_save": getattr(b, "in_flight_at_save", None)}


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def leader(asynchronous, staleness, groups="node"):
    return lambda m: hvd.LeaderOptimizer(sgd(m), m.named_parameters(), period=2, global_period=4, groups=groups,
                                         asynchronous=asynchronous, max_staleness=staleness)


def easgd(asynchronous, staleness):
    return lambda m: hvd.ElasticAveragingOptimizer(sgd(m), m.named_parameters(), beta=0.5, period=2,
                                                   asynchronous=asynchronous, max_staleness=staleness)


def check_center():
    m = model(seed=300 + RANK)
    opt = hvd.LeaderOptimizer(sgd(m), m.named_parameters(), groups=None)
    everyone = gathered(m)
    with opt.evaluation_parameters(which="center"):
        inside = flat(m).numpy()
    out = {"center_error": float(np.max(np.abs(inside - everyone.mean(axis=0)))),
           "restored": bool(np.array_equal(flat(m).numpy(), everyone[RANK]))}
    try:
        opt.evaluation_parameters(which="average")
    except ValueError as exc:
        out["bad_which"] = str(exc)
    return out


def bad_inputs():
    m = model(seed=1)
    cases = [
        expect_error("negative", lambda: hvd.LeaderOptimizer(sgd(m), m.named_parameters(), asynchronous=True,
                                                             max_staleness=-1)),
        expect_error("not_bool", lambda: hvd.ElasticAveragingOptimizer(sgd(m), m.named_parameters(),
                                                                       asynchronous="yes")),
        expect_error("without_async", lambda: hvd.LeaderOptimizer(sgd(m), m.named_parameters(), max_staleness=2)),
        expect_error("differs", lambda: hvd.LeaderOptimizer(sgd(m), m.named_parameters(),
                                                            asynchronous=RANK == 0)),
    ]
    alive = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="check.alive").item()
    return {"cases": cases, "alive": alive}


def main():
    groups = "node"
    out = {"rank": RANK, "size": SIZE}
    # staleness 3 (the default at period 4) with slowed transfers; and rounds that overlap (staleness 5 > period 2)
    out["lsgd_delayed"] = leader_schedule(groups, 4, 8, 3, DELAY, 13, seed=10)
    out["lsgd_overlapping"] = leader_schedule(groups, 2, 4, 5, 0.0, 14, seed=20)
    out["lsgd_single"] = leader_schedule(None, 2, 2, 1, 0.0, 8, seed=30)
    out["easgd_delayed"] = easgd_schedule(4, 3, DELAY, 13, seed=40)
    out["sync_equal"] = {
        "lsgd": lockstep(leader(False, None), leader(True, 0), 12, seed=50),
        "lsgd_single": lockstep(leader(False, None, groups=None), leader(True, 0, groups=None), 12, seed=55),
        "easgd": lockstep(easgd(False, None), easgd(True, 0), 12, seed=60),
    }
    out["resume"] = {
        "lsgd": lockstep(leader(True, 3), leader(True, 3), 14, seed=70, save_at=6),
        "easgd": lockstep(easgd(True, 3), easgd(True, 3), 14, seed=80, save_at=5),
    }
    out["center"] = check_center()
    out["bad_inputs"] = bad_inputs()
    write_result(RANK, out)
    end_with_rounds_in_flight()


def end_with_rounds_in_flight():
    """The script's end with asynchronous rounds still in flight, one rank well ahead of the other: rank 0 reaches
    the exit while rank 1 has yet to start the last round, which rank 0 has started. The rounds in flight are
    completed at exit (horovod_ext/in_flight.py); a rank that shut Horovod down with them pending would fail rank
    1's next collective ("Horovod has been shut down"), and this launch would exit non-zero."""
    m = model(seed=90 + RANK)
    opt = hvd.ElasticAveragingOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), period=2,
                                        asynchronous=True, max_staleness=1)
    for step in range(1, 5):
        if RANK == 1 and step == 4:
            time.sleep(2.0)
        x, y = batches(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()


if __name__ == "__main__":
    main()
