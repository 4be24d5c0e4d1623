"""Counted bytes against horovod_ext.perfmodel's plans, and hvd.project from a running job, in PyTorch (run by
horovodrun at 2 ranks, and at 4 as two "nodes"). tests/test_perfmodel.py asserts on every rank's record."""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import horovod_ext.torch as hvd  # noqa: E402
from horovod_ext import perfmodel  # noqa: E402
from horovod_ext.compression.wire import allreduce_wire_bytes  # noqa: E402
from hvdrun import write_result  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)
STEPS = 16  # a whole multi-leader cycle (global_period 16)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                               torch.nn.Linear(256, 10))


COMPRESSORS = {"dense": hvd.Compression.none, "fp16": hvd.Compression.fp16,
               "ternary": hvd.Compression.ternary(packing="base3"),
               "ternary_two_phase": hvd.Compression.ternary(packing="base3", shared_scale=True, transport="two_phase")}
OPTIMIZERS = {"lsgd": lambda o, n: hvd.LeaderOptimizer(o, n, groups=None),
              "multi_lsgd": lambda o, n: hvd.LeaderOptimizer(o, n, groups="node"),
              "easgd": lambda o, n: hvd.ElasticAveragingOptimizer(o, n)}


def train(name):
    m = model()
    base = torch.optim.SGD(m.parameters(), lr=0.01)
    if name in COMPRESSORS:
        opt = hvd.DistributedOptimizer(base, named_parameters=m.named_parameters(), compression=COMPRESSORS[name])
    else:
        opt = OPTIMIZERS[name](base, m.named_parameters())
    g = torch.Generator().manual_seed(RANK)
    for _ in range(STEPS):
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        if name not in COMPRESSORS:
            opt.report_loss(loss)
        opt.step()
    return m, opt


def main():
    out = {"rank": RANK, "size": SIZE, "counted": {}, "planned": {}}
    shapes = [tuple(p.shape) for p in model().parameters()]
    per_node = int(os.environ.get("HOROVOD_LOCAL_SIZE", SIZE))
    for name in list(COMPRESSORS) + list(OPTIMIZERS):
        _, opt = train(name)
        stats = opt.compression_stats()
        counted = stats["total"]["wire_bytes"]
        if name == "easgd":  # less its one-time allreduce that starts the center (perfmodel plans steady steps)
            counted -= allreduce_wire_bytes(4 * sum(math.prod(s) for s in shapes), SIZE)
        out["counted"][name] = counted / stats["steps"]
        kw = {"ranks_per_node": per_node} if name == "multi_lsgd" else {}
        out["planned"][name] = perfmodel.wire_bytes_per_step(perfmodel.plan(name, shapes, SIZE, **kw))
        if name == "ternary":
            predictions = hvd.project(opt, ranks=64, gbit=10)
            out["project"] = {
                "methods": sorted(predictions), "compute": perfmodel.compute_seconds_of(stats),
                "step": stats["step_seconds"],
                "finite": all(math.isfinite(p.step_seconds) and p.step_seconds > 0 for p in predictions.values()),
                "dense_speedup": predictions["dense"].speedup_over_dense}
    write_result(RANK, out)


if __name__ == "__main__":
    main()
