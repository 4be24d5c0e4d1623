"""LeaderOptimizer, ElasticAveragingOptimizer and DiLoCoOptimizer through either PyTorch adapter (tests/test_ddp.py):
"horovod" (horovod_ext.torch under horovodrun) or "ddp" (horovod_ext.ddp under torchrun, Horovod hidden). Every
rank trains the same seeded MLP on its own batches with each method and records its parameters' digest and bytes;
the two adapters must give the same bits. Under "ddp" a checkpoint (each rank's state_dict) also resumes to the
uninterrupted bits, and bad input raises on every rank."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ADAPTER = sys.argv[1]
if ADAPTER == "ddp":
    import hide_horovod  # noqa: E402

    hide_horovod.hide()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bucket_cases import digest  # noqa: E402
from hvdrun import expect_error, write_result  # noqa: E402

if ADAPTER == "ddp":
    import torch.distributed as dist  # noqa: E402

    import horovod_ext.ddp as hx  # noqa: E402

    dist.init_process_group("gloo")
    RANK, SIZE = dist.get_rank(), dist.get_world_size()
else:
    import horovod_ext.torch as hx  # noqa: E402

    hx.init()
    RANK, SIZE = hx.rank(), hx.size()
torch.set_num_threads(1)
STEPS, HALF = 12, 7
GROUPS = [[0, 1], [2, 3]] if SIZE == 4 else [[r] for r in range(SIZE)]  # at 4 ranks, groups of torch.distributed
PAIRS = [[0, 1], [2, 3]] if SIZE == 4 else None  # DiLoCo's workers of two ranks at 4 ranks

METHODS = {
    "lsgd": lambda opt, named: hx.LeaderOptimizer(opt, named, pull=0.2, period=2, groups=None),
    "lsgd-groups": lambda opt, named: hx.LeaderOptimizer(opt, named, pull=0.2, global_pull=0.1, period=2,
                                                         global_period=4, groups=GROUPS),
    "async_lsgd": lambda opt, named: hx.LeaderOptimizer(opt, named, pull=0.2, period=2, groups=None,
                                                        asynchronous=True),
    "easgd": lambda opt, named: hx.ElasticAveragingOptimizer(opt, named, beta=0.5, period=2),
    "async_easgd": lambda opt, named: hx.ElasticAveragingOptimizer(opt, named, beta=0.5, period=2,
                                                                   asynchronous=True),
    "diloco": lambda opt, named: hx.DiLoCoOptimizer(opt, named, inner_steps=3),
    "diloco-ternary-streaming": lambda opt, named: hx.DiLoCoOptimizer(
        opt, named, inner_steps=4, fragments=2, overlap=1,
        compression=hx.Compression.ternary(error_feedback=True, min_size=0)),
    "diloco-topk-groups": lambda opt, named: hx.DiLoCoOptimizer(
        opt, named, inner_steps=3, groups=PAIRS, compression=hx.Compression.topk(ratio=0.2)),
    "diloco-leader": lambda opt, named: hx.DiLoCoOptimizer(
        opt, named, inner_steps=3, outer="leader", compression=hx.Compression.ternary(min_size=0)),
}


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(step):
    rng = np.random.default_rng(1000 * RANK + step)
    return torch.from_numpy(rng.normal(size=(8, 12)).astype(np.float32)), torch.from_numpy(rng.integers(0, 4, 8))


def train(method, m, opt, steps):
    for step in steps:
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.report_loss(loss)
        opt.step()


def made(method):
    m = model()
    return m, METHODS[method](torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), m.named_parameters())


def bits(m):
    return digest(p.detach().numpy() for p in m.parameters())


record = {"rank": RANK, "adapter": ADAPTER, "bits": {}, "bytes": {}, "resumed": {}, "params": {}}
for method in METHODS:
    m, opt = made(method)
    train(method, m, opt, range(STEPS))
    record["bits"][method] = bits(m)
    record["params"][method] = torch.cat([p.detach().reshape(-1) for p in m.parameters()]).tolist()
    record["bytes"][method] = opt.compression_stats()["total"]["payload_bytes"]
    if ADAPTER == "ddp":  # stop after HALF steps, save, build anew, load, finish: the uninterrupted bits
        m, opt = made(method)
        train(method, m, opt, range(HALF))
        saved = {"model": m.state_dict(), "opt": opt.state_dict()}
        m, opt = made(method)
        m.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        train(method, m, opt, range(HALF, STEPS))
        record["resumed"][method] = bits(m)

if ADAPTER == "ddp":
    m = model()
    sgd = torch.optim.SGD(m.parameters(), lr=0.1)
    record["bad_inputs"] = {"cases": [
        expect_error("pull_range", lambda: hx.LeaderOptimizer(sgd, m.named_parameters(), pull=1.5)),
        expect_error("pull_differs", lambda: hx.LeaderOptimizer(sgd, m.named_parameters(), pull=0.1 + 0.1 * RANK)),
        expect_error("beta", lambda: hx.ElasticAveragingOptimizer(sgd, m.named_parameters(), beta=0)),
        expect_error("diloco_groups", lambda: hx.DiLoCoOptimizer(sgd, m.named_parameters(), groups=[[0]])),
    ]}
    alive = torch.ones(1)
    dist.all_reduce(alive)
    record["bad_inputs"]["alive"] = int(alive.item())

write_result(RANK, record)
if ADAPTER == "ddp":
    dist.destroy_process_group()
    # Gloo can abort in the interpreter's teardown after asynchronous work (pytorch/pytorch#190489; docs/ddp.md):
    # everything is written, so leave without it
    sys.stdout.flush()
    os._exit(0)
