"""Runs under horovodrun (inside the shaped namespace): step time, communication seconds and bytes per step of
each compression on a synthetic MLP, and of PyTorch DDP dense / fp16 hook / PowerSGD hook (baselines.py), whose
communication seconds are the step time minus the same step's compute alone (DDP overlaps the two).
Rank 0 writes JSON to --json."""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import horovod_ext.torch as hvd  # noqa: E402
from baselines import DDP_METHODS, ddp_wrap  # noqa: E402
from horovod_ext.compression.wire import allreduce_wire_bytes  # noqa: E402

COMPRESSIONS = {"none": lambda: hvd.Compression.none, "fp16": lambda: hvd.Compression.fp16,
                "ternary": lambda: hvd.Compression.ternary,  # entropy coded (the default)
                "ternary-base3": lambda: hvd.Compression.ternary(packing="base3", transport="allgather"),
                "ternary-shared": lambda: hvd.Compression.ternary(shared_scale=True, transport="allgather"),
                "ternary-2phase": lambda: hvd.Compression.ternary(shared_scale=True, transport="two_phase"),
                "ternary-2phase-base3": lambda: hvd.Compression.ternary(shared_scale=True, transport="two_phase",
                                                                        packing="base3"),
                "topk": lambda: hvd.Compression.topk(ratio=0.01),  # delta-coded indices, fp16 values (the default)
                "topk-allgather": lambda: hvd.Compression.topk(ratio=0.01, transport="allgather"),
                "topk-sparse": lambda: hvd.Compression.topk(ratio=0.01, transport="sparse_reduce"),
                "topk0.1-allgather": lambda: hvd.Compression.topk(ratio=0.001, transport="allgather"),
                "topk0.1-sparse": lambda: hvd.Compression.topk(ratio=0.001, transport="sparse_reduce"),
                "topk-int32": lambda: hvd.Compression.topk(ratio=0.01, packing="int32"),
                "topk-ternary": lambda: hvd.Compression.topk(ratio=0.01, value_dtype="ternary"),
                "adaptive_topk": lambda: hvd.Compression.adaptive_topk,  # GraVAC at its defaults
                # Compression.powersgd compressing from the first step (the DDP hook's "powersgd", "powersgd-rN"
                # rows are timed from its first compressed step too)
                "hvdext-powersgd": lambda: hvd.Compression.powersgd(start_iter=0),
                "hvdext-powersgd-r1": lambda: hvd.Compression.powersgd(rank=1, start_iter=0),
                "hvdext-powersgd-r2": lambda: hvd.Compression.powersgd(rank=2, start_iter=0)}


def model_of(params_m):
    """An MLP of about params_m million parameters: width w, layers w->4w->w->w/2->10 (8.5 w^2 weights)."""
    width = max(64, round((params_m * 1e6 / 8.5) ** 0.5))
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.ReLU(), torch.nn.Linear(4 * width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, width // 2), torch.nn.ReLU(),
                               torch.nn.Linear(width // 2, 10)), width


def measure_ddp(name, params_m, steps, batch):
    torch.manual_seed(0)
    model, width = model_of(params_m)
    ddp, payload, wire = ddp_wrap(model, name, hvd.rank(), hvd.size())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(batch, width), torch.randint(0, 10, (batch,))

    def step(sync=True):
        opt.zero_grad()
        if sync:
            F.cross_entropy(ddp(x), y).backward()
        else:
            with ddp.no_sync():
                F.cross_entropy(ddp(x), y).backward()
        opt.step()

    times, compute = [], []
    for i in range(steps + 3):  # PowerSGD starts compressing at its 2nd iteration; the first 3 are not counted
        hvd.barrier()
        start = time.perf_counter()
        step()
        if i >= 3:
            times.append(time.perf_counter() - start)
            start = time.perf_counter()
            step(sync=False)
            compute.append(time.perf_counter() - start)
    dense = 4 * sum(p.numel() for p in model.parameters())
    return {"compression": name, "ranks": hvd.size(), "parameters": dense // 4,
            "step_seconds": statistics.median(times),
            "comm_seconds": max(statistics.median(times) - statistics.median(compute), 0.0),
            "payload_bytes": payload, "wire_bytes": wire, "transport": "DDP allreduce",
            "dense_bytes": dense, "dense_wire_bytes": allreduce_wire_bytes(dense, hvd.size())}


def measure(name, params_m, steps, batch):
    if name in DDP_METHODS:
        return measure_ddp(name, params_m, steps, batch)
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
