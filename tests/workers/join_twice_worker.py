"""Uneven data with hvd.join() at the end of every epoch, twice, under horovodrun, for each compressor named in
argv[1:] in turn (a fresh model and optimizer each). After the first join the ranks' step counts differ; the second
epoch must not hang (step-level collective names advance only on steps every rank takes; Compression.auto's windows
count only those steps). Records, per compressor: the steps, the joined (dense) steps, a step-level collective's
name after the run, and auto's choice."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import horovod_ext.torch as hvd  # noqa: E402
from hvdrun import write_result  # noqa: E402

COMPRESSIONS = {
    "ternary_shared": lambda: hvd.Compression.ternary(shared_scale=True, min_size=0),
    # a window of 4 ends inside the joined steps and in the epoch after; the rest at auto's defaults
    "auto": lambda: hvd.Compression.auto(window=4),
    # linear candidates alone: the join check is read at finish(), after the step has launched as if no rank joined
    "auto_linear": lambda: hvd.Compression.auto(candidates=("none", "fp16"), window=4),
}


def run(name):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    compression = COMPRESSIONS[name]() if name in COMPRESSIONS else getattr(hvd.Compression, name)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(hvd.rank())
    for epoch in range(2):
        for _ in range(3 + 2 * hvd.rank()):  # rank 1 has more batches
            x = torch.randn(8, 16, generator=gen)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1)).backward()
            opt.step()
        hvd.join()
    stats = opt.compression_stats()
    return {"steps": stats["steps"], "join_dense_steps": stats.get("join_dense_steps", 0),
            "step_name": opt._hx_run.driver.be.step_name("join_twice"),
            "choice": {n: e["method"] for n, e in sorted(stats.get("choice", {}).items())}}


hvd.init()
write_result(hvd.rank(), {name: run(name) for name in sys.argv[1:]})
