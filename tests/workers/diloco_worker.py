"""DiLoCoOptimizer under horovodrun (tests/test_diloco.py). Each rank fits its own linear-regression data with SGD
inner steps (H = 3, 4 rounds); after each inner step that ends a round (the optimizer's step post-hook, before the
exchange) the rank records its parameters, and after each round the outer parameters. Per compressor, the ranks
report: every rank's recorded parameters, the outer parameters after each round and their bits on every rank;
then a resume (rank 0's checkpoint after round 2, Horovod's load-and-broadcast idiom) continues to the same bits;
then the bad arguments, each raised on every rank."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import horovod_ext.torch as hvd  # noqa: E402
from diloco_cases import STREAM_ARGUMENTS, STREAM_SAVE, STREAM_STEPS, streaming_cases  # noqa: E402
from hvdrun import expect_error, write_result  # noqa: E402

H, ROUNDS = 3, 4
TERNARY = lambda: hvd.Compression.ternary(error_feedback=True, min_size=16)  # noqa: E731
COMPRESSIONS = {"none": lambda: hvd.Compression.none, "ternary-ef": TERNARY,
                "topk-ef": lambda: hvd.Compression.topk(ratio=0.1)}


def groups():
    """Workers of two ranks: one worker at 2 ranks, the two "nodes" of -H localhost:2,127.0.0.1:2 at 4."""
    return [[0, 1]] if hvd.size() == 2 else "node"


# with groups: (outer compression, inner compression)
GROUPED = {"groups-none": (lambda: hvd.Compression.none, lambda: hvd.Compression.none),
           "groups-ternary-inner": (TERNARY, TERNARY)}


def arguments(name):
    if name in GROUPED:
        outer, inner = GROUPED[name]
        return {"compression": outer(), "inner_compression": inner(), "groups": groups()}
    return {"compression": COMPRESSIONS[name]()}


def data(rank):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(32, 8, generator=g)
    y = x @ torch.linspace(-1.0, 1.0, 32).reshape(8, 4) * (1 + 0.1 * rank) + 0.5 * rank
    return x, y



def record_local_parameters(opt, model, into):
    """After every H-th inner step (the end of a round's inner steps), append the worker's parameters to `into`."""
    taken = [0]

    def record(optimizer, args, kwargs):
        taken[0] += 1
        if taken[0] % H == 0:
            into.append([p.detach().clone().tolist() for p in model.parameters()])

    opt.register_step_post_hook(record)

def run(name, rounds=ROUNDS, resume_at=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    opt = hvd.DiLoCoOptimizer(inner, model.named_parameters(), inner_steps=H, **arguments(name))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = data(hvd.rank())
    local, outer, saved = [], [[p.detach().clone().tolist() for p in model.parameters()]], None
    record_local_parameters(opt, model, local)
    for step in range(1, rounds * H + 1):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step % H == 0:
            outer.append([p.detach().clone().tolist() for p in model.parameters()])
            if resume_at is not None and step // H == resume_at:
                saved = ({k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict())
    return model, opt, local, outer, saved


def resumed(name, saved):
    """The rounds after a checkpoint: Horovod's idiom (rank 0 loads it, broadcast_parameters and
    broadcast_optimizer_state) for the compressor without residuals; with error feedback every rank loads its own
    (its residuals are its own)."""
    torch.manual_seed(1)  # not the first run's model: everything must come from the checkpoint
    model = torch.nn.Linear(8, 4)
    opt = hvd.DiLoCoOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                              inner_steps=H, **arguments(name))
    broadcast = name in ("none", "groups-none")  # no residuals: rank 0's checkpoint for every rank
    if not broadcast or hvd.rank() == 0:
        model.load_state_dict(saved[0])
        opt.load_state_dict(saved[1])
    if broadcast:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    x, y = data(hvd.rank())
    outer = []
    for step in range(2 * H + 1, ROUNDS * H + 1):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step % H == 0:
            outer.append([p.detach().clone().tolist() for p in model.parameters()])
    return outer


def uneven_then_join(name):
    """Uneven data (rank r has r rounds fewer), then hvd.join() on every rank: the rounds of the ranks still
    training average with the joined ranks' zeros (Horovod's join), and every rank returns from join. Recorded: the
    parameters at the start, after each round's inner steps (before the exchange) and after each round."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = hvd.DiLoCoOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                              inner_steps=H, **arguments(name))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    start, local, outer = [p.detach().clone().tolist() for p in model.parameters()], [], []
    record_local_parameters(opt, model, local)
    x, y = data(hvd.rank())
    for step in range(1, (ROUNDS - hvd.rank()) * H + 1):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step % H == 0:
            outer.append([p.detach().clone().tolist() for p in model.parameters()])
    last = hvd.join()
    return {"outer": outer, "last_joined": int(last), "rounds": opt.compression_stats()["outer_rounds"],
            "start": start, "local": local}


def a_slower_worker_ends_last():
    """The script's last step is an inner step of workers of two ranks, and the worker of rank 0 starts it 2 s
    after the others: the other worker ends the script first, and Horovod must not shut down under the first
    worker's last in-group allreduce (horovod_ext/in_flight.py: at exit every rank waits for every other).
    Called last: what it checks is that the launch ends with every rank's exit status 0."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = hvd.DiLoCoOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                              inner_steps=H, groups=groups())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = data(hvd.rank())
    for step in range(H + 1):  # a round, then one inner step
        if step == H and hvd.rank() in opt.compression_stats()["workers"][0]:
            time.sleep(2.0)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return opt.compression_stats()["inner_steps_taken"]


STREAMING = streaming_cases(hvd.Compression, TERNARY)  # tests/diloco_cases.py


def stream_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 4))


def stream_optimizer(name, model):
    case = STREAMING[name]
    return hvd.DiLoCoOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                               **STREAM_ARGUMENTS, merge_alpha=case["merge_alpha"],
                               compression=case["compression"](), groups=groups() if case.get("groups") else None,
                               outer=case.get("outer", "average"))


def stream_steps(model, opt, first, last, x, y):
    """Steps first..last; per step the parameters after the inner step (before the exchange: the step post-hook),
    after opt.step(), the outer parameters, the loss and the last elected rank (outer="leader")."""
    flat_now = lambda: torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()  # noqa: E731
    pre, post, outer, losses, elected = [], [], [], [], []
    handle = opt.register_step_post_hook(lambda *_: pre.append(flat_now()))
    for _ in range(first, last + 1):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.report_loss(loss)  # what outer="leader" elects by
        losses.append(float(loss))
        opt.step()
        post.append(flat_now())
        elected.append(opt.compression_stats()["elected"])
        with opt.evaluation_parameters():
            outer.append(flat_now())
    handle.remove()
    return pre, post, outer, losses, elected


def stream_start(name):
    """This rank's data, the model and the case's optimizer, with rank 0's parameters (Horovod's idiom)."""
    model = stream_model()
    opt = stream_optimizer(name, model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return (*data(hvd.rank()), model, opt)


def streaming(name):
    """A streaming run of STREAM_STEPS steps; rank r's own checkpoint after STREAM_SAVE (an exchange in flight),
    loaded into a new model and optimizer that take the remaining steps."""
    x, y, model, opt = stream_start(name)
    start = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    pre, post, outer, losses, elected = stream_steps(model, opt, 1, STREAM_SAVE, x, y)
    saved = ({k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict())
    in_flight = opt.compression_stats()["in_flight"]
    more = stream_steps(model, opt, STREAM_SAVE + 1, STREAM_STEPS, x, y)
    stats = opt.compression_stats()
    again = stream_model()
    torch.manual_seed(1)
    again_opt = stream_optimizer(name, again)
    again.load_state_dict(saved[0])
    again_opt.load_state_dict(saved[1])
    resumed = stream_steps(again, again_opt, STREAM_SAVE + 1, STREAM_STEPS, x, y)
    offsets, ranges = {}, []
    for n, p in model.named_parameters():
        offsets[n] = (sum(o[1] for o in offsets.values()), p.numel())
    ranges = [[offsets[n] for n in names] for names in stats["fragments"]]
    return {"rank": hvd.rank(), "ranges": ranges, "start": start, "pre": pre + more[0], "post": post + more[1],
            "outer": outer + more[2],
            "losses": losses + more[3], "elected": stats["elected"], "elected_at": elected + more[4],
            "in_flight_at_save": in_flight, "resumed": {"pre": resumed[0], "post": resumed[1], "outer": resumed[2]},
            "fragments": stats["fragments"], "rounds": stats["outer_rounds"], "workers": stats["workers"],
            "peak": stats["peak_exchange_payload_bytes"], "payload_bytes": stats["total"]["payload_bytes"]}


def streaming_then_join(name):
    """Uneven data under streaming with overlap (rank r takes 2 r steps fewer, so that exchanges are in flight
    when ranks stop), then hvd.join() on every rank; recorded as streaming() records, and the outer parameters
    after join."""
    x, y, model, opt = stream_start(name)
    start = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    pre, post, _, losses, elected = stream_steps(model, opt, 1, STREAM_STEPS - 2 * hvd.rank(), x, y)
    last = hvd.join()
    with opt.evaluation_parameters():
        outer = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    return {"last_joined": int(last), "outer": outer, "rounds": opt.compression_stats()["outer_rounds"],
            "start": start, "pre": pre, "post": post, "losses": losses, "elected_at": elected}


def main():
    hvd.init()
    out = {"rank": hvd.rank(), "size": hvd.size(), "runs": {}, "join": {}, "errors": []}
    x, y = data(hvd.rank())
    out["data"] = [x.tolist(), y.tolist()]
    for name in [*COMPRESSIONS, *GROUPED]:
        model, opt, local, outer, saved = run(name, resume_at=2)
        stats = opt.compression_stats()
        out["runs"][name] = {"local": local, "outer": outer, "resumed": resumed(name, saved),
                             "payload_bytes": stats["total"]["payload_bytes"],
                             "dense_bytes": stats["total"]["dense_bytes"], "rounds": stats["outer_rounds"],
                             "norm": stats["outer_update_norm"], "workers": stats["workers"],
                             "leader": stats["leader"], "inner": stats.get("inner", {}).get("total"),
                             "names": [n for n, _ in model.named_parameters()]}
    for name in ("none", "ternary-ef"):
        out["join"][name] = uneven_then_join(name)
    out["streaming"] = {name: streaming(name) for name in STREAMING}
    out["streaming_join"] = {name: streaming_then_join(name) for name in ("stream-ternary-merge", "leader-ternary")}
    model = torch.nn.Linear(8, 4)
    bad = {"inner_steps=0": {"inner_steps": 0}, "outer_lr=0": {"outer_lr": 0.0},
           "outer_momentum=1": {"outer_momentum": 1.0},
           "inner_steps differs": {"inner_steps": 5 + hvd.rank()},
           "outer_lr on rank 1": {"outer_lr": -1.0 if hvd.rank() == 1 else 0.7},
           "groups leave rank 1 out": {"groups": [[0]] if hvd.size() == 2 else [[0], [2, 3]]},
           "inner_compression without groups": {"inner_compression": TERNARY()},
           "inner_compression on rank 0 only": {"groups": groups(),
                                                "inner_compression": TERNARY() if hvd.rank() == 0 else None}}
    stream_bad = {"fragments more than the layers": {"inner_steps": 6, "fragments": 2},
                  "fragments not dividing inner_steps": {"inner_steps": 6, "fragments": 4},
                  "overlap not below H / P": {"inner_steps": 6, "fragments": 1, "overlap": 6},
                  "merge_alpha outside [0, 1]": {"merge_alpha": 1.5},
                  "overlap on rank 1 only": {"inner_steps": 6, "overlap": 1 if hvd.rank() == 1 else 0},
                  "an unknown outer": {"outer": "median"},
                  "leader with powersgd": {"outer": "leader", "compression": hvd.Compression.powersgd}}
    bad.update(stream_bad)
    for case, kwargs in bad.items():
        out["errors"].append(expect_error(case, lambda: hvd.DiLoCoOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), **kwargs)))
    out["slower_worker_steps"] = a_slower_worker_ends_last()
    write_result(hvd.rank(), out)


if __name__ == "__main__":
    main()
