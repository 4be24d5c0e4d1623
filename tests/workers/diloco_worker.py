"""DiLoCoOptimizer under horovodrun (tests/test_diloco.py). Each rank fits its own linear-regression data with SGD
inner steps (H = 3, 4 rounds); after each inner step that ends a round (the optimizer's step post-hook, before the
exchange) the rank records its parameters, and after each round the outer parameters. Per compressor, the ranks
report: every rank's recorded parameters, the outer parameters after each round and their bits on every rank;
then a resume (rank 0's checkpoint after round 2, Horovod's load-and-broadcast idiom) continues to the same bits;
then the bad arguments, each raised on every rank."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import horovod_ext.torch as hvd  # noqa: E402
from hvdrun import expect_error, write_result  # noqa: E402

H, ROUNDS = 3, 4
COMPRESSIONS = {"none": lambda: hvd.Compression.none,
                "ternary-ef": lambda: hvd.Compression.ternary(error_feedback=True, min_size=16),
                "topk-ef": lambda: hvd.Compression.topk(ratio=0.1)}


def data(rank):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(32, 8, generator=g)
    y = x @ torch.linspace(-1.0, 1.0, 32).reshape(8, 4) * (1 + 0.1 * rank) + 0.5 * rank
    return x, y


def run(name, rounds=ROUNDS, resume_at=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    opt = hvd.DiLoCoOptimizer(inner, model.named_parameters(), inner_steps=H, compression=COMPRESSIONS[name]())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = data(hvd.rank())
    local, outer, saved = [], [[p.detach().clone().tolist() for p in model.parameters()]], None
    taken = [0]

    def record(optimizer, args, kwargs):
        taken[0] += 1
        if taken[0] % H == 0:
            local.append([p.detach().clone().tolist() for p in model.parameters()])

    opt.register_step_post_hook(record)
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
                              inner_steps=H, compression=COMPRESSIONS[name]())
    if name != "none" or hvd.rank() == 0:
        model.load_state_dict(saved[0])
        opt.load_state_dict(saved[1])
    if name == "none":
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


def main():
    hvd.init()
    out = {"rank": hvd.rank(), "size": hvd.size(), "runs": {}, "errors": []}
    for name in COMPRESSIONS:
        model, opt, local, outer, saved = run(name, resume_at=2)
        stats = opt.compression_stats()
        out["runs"][name] = {"local": local, "outer": outer, "resumed": resumed(name, saved),
                             "payload_bytes": stats["total"]["payload_bytes"],
                             "dense_bytes": stats["total"]["dense_bytes"], "rounds": stats["outer_rounds"],
                             "norm": stats["outer_update_norm"]}
    model = torch.nn.Linear(8, 4)
    bad = {"inner_steps=0": {"inner_steps": 0}, "outer_lr=0": {"outer_lr": 0.0},
           "outer_momentum=1": {"outer_momentum": 1.0},
           "inner_steps differs": {"inner_steps": 5 + hvd.rank()},
           "outer_lr on rank 1": {"outer_lr": -1.0 if hvd.rank() == 1 else 0.7}}
    for case, kwargs in bad.items():
        out["errors"].append(expect_error(case, lambda: hvd.DiLoCoOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), **kwargs)))
    write_result(hvd.rank(), out)


if __name__ == "__main__":
    main()
