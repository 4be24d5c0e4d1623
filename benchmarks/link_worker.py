"""Runs under horovodrun (inside the shaped namespace): step time, communication seconds and bytes per step of
each compression on a synthetic MLP. Rank 0 writes JSON to --json."""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import horovod_ext.torch as hvd

COMPRESSIONS = {"none": lambda: hvd.Compression.none, "fp16": lambda: hvd.Compression.fp16,
                "ternary": lambda: hvd.Compression.ternary,
                "ternary-shared": lambda: hvd.Compression.ternary(shared_scale=True, transport="allgather"),
                "ternary-2phase": lambda: hvd.Compression.ternary(shared_scale=True, transport="two_phase")}


def model_of(params_m):
    """An MLP of about params_m million parameters: width w, layers w->4w->w->w/2->10 (8.5 w^2 weights)."""
    width = max(64, round((params_m * 1e6 / 8.5) ** 0.5))
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.ReLU(), torch.nn.Linear(4 * width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, width // 2), torch.nn.ReLU(),
                               torch.nn.Linear(width // 2, 10)), width


def measure(name, params_m, steps, batch):
    torch.manual_seed(0)
    model, width = model_of(params_m)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), compression=COMPRESSIONS[name]())
    x, y = torch.randn(batch, width), torch.randint(0, 10, (batch,))
    times, comm = [], []
    for step in range(steps + 1):  # the first step (settings exchange, warm-up) is not counted
        hvd.barrier()
        before = opt.compression_stats()["total"]["comm_seconds"]
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if step:
            times.append(time.perf_counter() - start)
            comm.append(opt.compression_stats()["total"]["comm_seconds"] - before)
    last = opt.compression_stats()["last_step"]
    return {"compression": name, "ranks": hvd.size(), "parameters": sum(p.numel() for p in model.parameters()),
            "step_seconds": statistics.median(times), "comm_seconds": statistics.median(comm),
            "payload_bytes": last["payload_bytes"], "wire_bytes": last["wire_bytes"],
            "transport": opt.compression_stats().get("transport", "allreduce"),
            "dense_bytes": last["dense_bytes"], "dense_wire_bytes": last["dense_wire_bytes"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compression", default="none,fp16,ternary")
    parser.add_argument("--params-m", type=float, default=10.5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    rows = [measure(name, args.params_m, args.steps, args.batch) for name in args.compression.split(",")]
    if hvd.rank() == 0:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
