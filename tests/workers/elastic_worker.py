"""Elastic training under ``horovodrun --gloo -np 2 --min-np 1 --max-np 3 --host-discovery-script`` (torch).

    python elastic_worker.py METHODS STEPS KILL_AT ADD_AT [COMMIT_EVERY]

METHODS is a comma list: one model per method, from the same initial weights, trained in lockstep in one job (one
TorchState holds every model and optimizer), so that one launch takes every method through the same faults.

The discovery script prints the file ``$HVDEXT_TEST_OUT/hosts``. At each step of KILL_AT (a comma list; -1: none)
the rank running on host 127.0.0.1 SIGKILLs itself, after backward has launched the step's collectives (so its
peers fail inside one), having first taken its host out of the hosts file. At each step of ADD_AT rank 0 writes
the hosts localhost, 127.0.0.1 (after Horovod's blacklist cooldown) and a third name of this machine
(tests/hvdrun.py third_host), then waits until Horovod has told it (the next commit resets).
benchmarks/elastic_soak.py runs it at 3 ranks with a kill every 200 steps. Every rank that finishes writes its
result: steps, commits, and per method parameters, statistics, bytes of the last step and the plan's bytes for the final
N, accuracy on a held-out set. METHOD "horovod" (alone) is Horovod's own script (horovod.torch, its
DistributedOptimizer), for the launcher `python -m horovod_ext.run`. KILL_AT = ADD_AT = -1 is the uninterrupted run a
soak compares with.
"""
import math
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import psutil  # noqa: E402
import torch  # noqa: E402

if __name__ == "__main__" and sys.argv[1] == "horovod":  # an unmodified Horovod script, run by horovod_ext.run
    import horovod.torch as hvd  # noqa: E402
else:
    import horovod_ext.torch as hvd  # noqa: E402
from horovod_ext.compression.join import join_check_wire_bytes  # noqa: E402
from horovod_ext.compressors.transports.two_phase import TwoPhasePlan, scale_sharing_bytes  # noqa: E402
from horovod_ext.compression.wire import allreduce_wire_bytes  # noqa: E402
from hvdrun import marker, write_hosts, write_result  # noqa: E402

FEATURES, CLASSES, BATCH, LR = 32, 4, 32, 0.05
COMPRESSORS = {
    "none": lambda: hvd.Compression.none,
    "ternary": lambda: hvd.Compression.ternary(shared_scale=True, transport="two_phase", packing="base3"),
    "ternary_allgather": lambda: hvd.Compression.ternary,
    "topk": lambda: hvd.Compression.topk(ratio=0.05, transport="allgather"),
    "topk_sparse_reduce": lambda: hvd.Compression.topk(ratio=0.05, transport="sparse_reduce", rebalance_every=4),
    "adaptive_topk": lambda: hvd.Compression.adaptive_topk,
    "powersgd": lambda: hvd.Compression.powersgd(rank=2),
    "auto": lambda: hvd.Compression.auto(min_size=0, window=5),
}
PARAMETER_SPACE = ("lsgd", "async_lsgd", "easgd", "diloco", "streaming_diloco")
DILOCO_INNER_STEPS = 4
# streaming: 2 fragments of 10 steps' window 5, each exchange applied 2 steps after it starts, so that one is in
# flight at the commits of steps 20 and 35 (the rollback's and the addition's); the leader as the outer step (the
# first election after a reset meets added ranks without a loss)
STREAMING = {"inner_steps": 10, "fragments": 2, "overlap": 2, "outer": "leader"}


def data():
    """A fixed teacher's labels on Gaussian inputs: 4096 training and 4096 held-out examples, the same on every
    rank (each trains on its own shard of each step's batches)."""
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)
    x = torch.randn(8192, FEATURES, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(8192, CLASSES, generator=g)).argmax(1)
    return x[:4096], y[:4096], x[4096:], y[4096:]


def learning_rate(step, steps):
    """Cosine decay from LR to 0 over the run (a function of the committed step, so a redone step has the
    rate it had): the final weights are a converged point, and runs compare by accuracy, not by where SGD's noise
    left the last step."""
    return LR * 0.5 * (1.0 + math.cos(math.pi * step / steps))


def make(method):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))
    base = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    if method == "easgd":
        return model, hvd.ElasticAveragingOptimizer(base, model.named_parameters())
    if method == "horovod":  # Horovod's own optimizer (the launcher's --compression replaces it)
        return model, hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    if method == "diloco":  # the outer step every 4 steps, ternary pseudo-gradients with error feedback
        return model, hvd.DiLoCoOptimizer(base, model.named_parameters(), inner_steps=DILOCO_INNER_STEPS,
                                          compression=hvd.Compression.ternary(error_feedback=True))
    if method == "streaming_diloco":
        return model, hvd.DiLoCoOptimizer(base, model.named_parameters(), **STREAMING,
                                          compression=hvd.Compression.ternary(error_feedback=True))
    if method in ("lsgd", "async_lsgd"):
        return model, hvd.LeaderOptimizer(base, model.named_parameters(), groups=None,
                                          asynchronous=method == "async_lsgd")
    return model, hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                           compression=COMPRESSORS[method]())


def planned_two_phase_bytes(model):
    """Bytes per step of this rank under ternary's two-phase transport for this job's N (min_size 1024)."""
    n, sizes = hvd.size(), [p.numel() for p in model.parameters()]
    big = [s for s in sizes if s >= 1024]
    small = 4 * sum(s for s in sizes if s < 1024)
    return TwoPhasePlan(big, n, "base3").wire_bytes(hvd.rank()) + scale_sharing_bytes(len(big), n) \
        + allreduce_wire_bytes(small, n) + join_check_wire_bytes(n)


def record_names(by_period, resets, training):
    """Every name horovod_ext gives a collective while a step trains (its settings exchange, named
    horovod_ext.*, aside), by reset period (the resets this process has been through): after each reset the
    names must be new (compression/generation.py)."""
    import horovod.torch as horovod_torch
    for fn in ("allreduce_async", "allreduce_async_", "allgather_async", "alltoall", "broadcast_async",
               "sparse_allreduce_async"):
        def recording(*args, _original=getattr(horovod_torch, fn), **kwargs):
            name = kwargs.get("name")
            if training[0] and name and not name.startswith("horovod_ext."):
                by_period.setdefault(len(resets), set()).add(name)
            return _original(*args, **kwargs)
        setattr(horovod_torch, fn, recording)


def method_result(method, model, opt, kept, x_test, y_test):
    """What a rank records of one method at the end: its evaluated parameters and accuracy, statistics, bytes."""
    evaluate = opt.evaluation_parameters if method in PARAMETER_SPACE else None
    with (evaluate() if evaluate else torch.no_grad()):
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
            params = torch.cat([p.detach().flatten() for p in model.parameters()])
    stats = opt.compression_stats()
    extra = {}
    if method == "ternary":
        extra["planned_wire_bytes"] = planned_two_phase_bytes(model)
    if method == "topk_sparse_reduce":
        regions = opt._hx_run.driver.method.sparse.regions
        extra["region_bounds"] = len(regions.bounds) if regions.bounds is not None else None
    if method in ("diloco", "streaming_diloco"):
        extra["outer_rounds"] = stats["outer_rounds"]
    if method == "auto":  # the ranks its link was last measured at, and its choice
        extra.update(link_ranks=stats["link_ranks"], choice={n: e["method"] for n, e in stats["choice"].items()})
    return {"accuracy": accuracy, "params": params.tolist(), "stats_steps": stats["steps"], "residuals_kept": kept,
            "transport": stats.get("transport"), "last_wire_bytes": stats["last_step"].get("wire_bytes"), **extra}


def main():
    methods, steps = sys.argv[1].split(","), int(sys.argv[2])
    kills, adds = ({int(s) for s in arg.split(",")} for arg in sys.argv[3:5])
    commit_every = int(sys.argv[5]) if len(sys.argv) > 5 else 5
    hvd.init()
    started_on = os.environ.get("HOROVOD_HOSTNAME")
    x, y, x_test, y_test = data()
    trained_by = {method: make(method) for method in methods}  # method -> (model, optimizer)
    resets = []
    state = hvd.elastic.TorchState(**{f"{kind}_{method}": value for method, pair in trained_by.items()
                                      for kind, value in zip(("model", "optimizer"), pair)}, step=0, commits=0)
    kept = {method: [] for method in methods}  # per reset: whether this survivor's residuals are the last commit's

    def on_reset():
        resets.append((state.step, hvd.size(), time.time()))
        for method, (_, opt) in trained_by.items():
            saved = state._handlers[f"optimizer_{method}"]._saved_optimizer_state
            ours = saved.get("horovod_ext", {})
            runs = ours["runs"] if "runs" in ours else [ours]  # DiLoCo: one exchange per fragment
            committed = {k: v for run in runs for k, v in (run.get("residuals") or {}).items()}
            if committed:
                held = {k: v for run in (opt._hx_runs if "runs" in ours else [opt._hx_run])
                        for k, v in (run.residuals or {}).items()}
                # as committed; a residual made after the commit starts from zero
                kept[method].append(set(committed) <= set(held)
                                    and all(torch.equal(held[k], committed[k]) for k in committed)
                                    and all(not held[k].any() for k in set(held) - set(committed)))

    state.register_reset_callbacks([on_reset])
    started = time.time()
    trained, rss = [0], [None]  # steps this process ran (redone ones included); its RSS after its first step
    names, training = {}, [False]
    if methods != ["horovod"]:
        record_names(names, resets, training)

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            n, r = hvd.size(), hvd.rank()
            first = (state.step * BATCH * n + r * BATCH) % len(x)
            training[0] = True
            losses = {}
            for method, (model, opt) in trained_by.items():  # every method's collectives are launched
                opt.zero_grad()
                losses[method] = torch.nn.functional.cross_entropy(model(x[first:first + BATCH]),
                                                                   y[first:first + BATCH])
                losses[method].backward()
            if state.step in kills and started_on == "127.0.0.1" and not os.path.exists(marker("killed", state.step)):
                third = [f"{os.environ['HVDEXT_THIRD_HOST']}:1"] if hvd.size() > 2 else []
                write_hosts(["localhost:1", *third])
                with open(marker("killed", state.step), "w") as f:
                    f.write(str(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)  # mid-step: this step's collectives are in flight
            for method, (model, opt) in trained_by.items():
                if hasattr(opt, "report_loss"):
                    opt.report_loss(losses[method])
                for group in opt.param_groups:
                    group["lr"] = learning_rate(state.step, steps)
                opt.step()
            training[0] = False
            state.step += 1
            trained[0] += 1
            if rss[0] is None:
                rss[0] = psutil.Process().memory_info().rss
            if state.step in adds and r == 0 and not os.path.exists(marker("added", state.step)):
                killed = max((float(open(marker("killed", k)).read() or 0) for k in kills
                              if os.path.exists(marker("killed", k))), default=0.0)
                time.sleep(max(0.0, killed + 2.5 - time.time()))  # the blacklist cooldown (1-2 s) has ended
                write_hosts(["localhost:1", "127.0.0.1:1", f"{os.environ['HVDEXT_THIRD_HOST']}:1"])
                open(marker("added", state.step), "w").close()
                deadline = time.time() + 60
                while state._host_messages.empty() and time.time() < deadline:
                    time.sleep(0.1)
            if state.step % commit_every == 0:
                state.commits += 1
                state.commit()

    train(state)
    result = {"rank": hvd.rank(), "size": hvd.size(), "step": state.step, "commits": state.commits,
              "started_on": started_on, "pid": os.getpid(), "resets": resets, "seconds": time.time() - started,
              "trained": trained[0], "rss_start": rss[0], "rss_end": psutil.Process().memory_info().rss,
              "names": {period: sorted(held) for period, held in names.items()},
              "methods": {method: method_result(method, model, opt, kept[method], x_test, y_test)
                          for method, (model, opt) in trained_by.items()}}
    write_result(hvd.rank(), result)


if __name__ == "__main__":
    main()
