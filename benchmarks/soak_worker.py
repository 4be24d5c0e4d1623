"""One soak run under horovodrun: a small MLP trained for --steps steps with one method; rank 0 writes, at each
checkpoint step, every rank's resident memory (RSS, MiB) and the steps per second since the previous checkpoint."""
import argparse
import json
import os
import sys
import time

import psutil
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import horovod_ext.torch as hvd  # noqa: E402

METHODS = ["none", "fp16", "ternary", "topk", "adaptive_topk", "lsgd", "easgd"]


def make(method, model):
    base = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if method == "lsgd":
        return hvd.LeaderOptimizer(base, model.named_parameters(), period=4, global_period=16, groups="node")
    if method == "easgd":
        return hvd.ElasticAveragingOptimizer(base, model.named_parameters(), period=4)
    compression = {"adaptive_topk": hvd.Compression.adaptive_topk(window=100)}.get(method) or \
        getattr(hvd.Compression, method)
    return hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), compression=compression)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", choices=METHODS, required=True)
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--checkpoints", default="1000,10000")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = make(args.method, model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(hvd.rank())
    data = [(torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen)) for _ in range(64)]
    checkpoints = [int(c) for c in args.checkpoints.split(",")]
    process, records, last_time, last_step = psutil.Process(), [], time.perf_counter(), 0
    for step in range(1, args.steps + 1):
        x, y = data[step % len(data)]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if hasattr(opt, "report_loss"):
            opt.report_loss(loss)
        opt.step()
        if step in checkpoints:
            now = time.perf_counter()
            rss = hvd.allgather(torch.tensor([process.memory_info().rss / 2 ** 20]), name=f"soak.rss.{step}")
            records.append({"step": step, "rss_mib": rss.tolist(), "steps_per_second": (step - last_step) /
                            (now - last_time)})
            last_time, last_step = time.perf_counter(), step
    if hvd.rank() == 0:
        with open(args.json, "w") as f:
            json.dump({"method": args.method, "ranks": hvd.size(), "records": records}, f)
    hvd.barrier()


if __name__ == "__main__":
    main()
