"""Runs under horovodrun: what each compressor asks of Horovod per step, counted where Horovod is called.

Every collective of horovod.torch that the package calls (``allreduce_async``, ``allgather_async``, ...) and every
``synchronize`` is wrapped in a counter before the package is imported, so the counts are the package's whole step:
its join check, scale sharing, payloads and dense tensors. For each step (after --warmup steps, which hold the
settings exchange):

- collectives: how many Horovod collectives the step enqueued;
- rounds: the longest chain of collectives in which one is enqueued after the step waited for another: a collective
  enqueued before any wait of the step is at depth 1, one enqueued after waiting for a depth-d collective at depth
  d + 1 (a blocking collective is enqueued and waited for at once); the step's rounds are its deepest collective's
  depth. Each round costs at least one cycle of Horovod's background thread and a network round trip;
- waits: synchronize calls; blocked: those whose collective had not completed when called (poll), each a sleep of
  the training thread until Horovod's thread wakes it.

Collectives and rounds do not depend on timing; blocked waits, the median step's seconds and the compression
seconds (compress + decompress, from compression_stats(), per measured step) do. Each model and compressor runs at
every --bucket-cap-mb (compression/buckets.py; 0: one collective per tensor). Rank 0 writes JSON to --json.
"""
import argparse
import json
import os
import statistics
import sys
import time

import horovod.torch as hvd_module
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rounds_counter import StepCounter  # noqa: E402

ASYNC = ("allreduce_async", "allreduce_async_", "allgather_async", "broadcast_async", "broadcast_async_",
         "alltoall_async", "sparse_allreduce_async", "grouped_allreduce_async", "grouped_allreduce_async_")
BLOCKING = ("allreduce", "allreduce_", "allgather", "broadcast", "broadcast_", "alltoall", "broadcast_object",
            "allgather_object", "grouped_allreduce", "grouped_allreduce_")


COUNTER = StepCounter()


def _wrap_async(fn):
    def counted(*args, **kwargs):
        handle = fn(*args, **kwargs)
        COUNTER.depth_of[handle] = COUNTER.enqueued()
        return handle
    return counted


def _wrap_blocking(fn):
    def counted(*args, **kwargs):
        depth = COUNTER.enqueued()
        result = fn(*args, **kwargs)
        COUNTER.waited(depth, True)
        return result
    return counted


def _wrap_synchronize(fn, poll):
    def counted(handle):
        blocked = not poll(handle)
        COUNTER.waited(COUNTER.depth_of.pop(handle, 0), blocked)
        return fn(handle)
    return counted


def instrument():
    for name in ASYNC:
        if hasattr(hvd_module, name):
            setattr(hvd_module, name, _wrap_async(getattr(hvd_module, name)))
    for name in BLOCKING:
        if hasattr(hvd_module, name):
            setattr(hvd_module, name, _wrap_blocking(getattr(hvd_module, name)))
    hvd_module.synchronize = _wrap_synchronize(hvd_module.synchronize, hvd_module.poll)


instrument()
import horovod_ext.torch as hvd  # noqa: E402  (after the counters are in place)

COMPRESSIONS = {"none": lambda: hvd.Compression.none, "fp16": lambda: hvd.Compression.fp16,
                "ternary": lambda: hvd.Compression.ternary,
                "ternary-shared": lambda: hvd.Compression.ternary(shared_scale=True),
                "topk": lambda: hvd.Compression.topk(ratio=0.01),
                "adaptive_topk": lambda: hvd.Compression.adaptive_topk,
                # matrices of one shape multiplied as one batch (batch_tensors, the default: deep80's 80 layers,
                # one bmm instead of 80 mm)
                "powersgd": lambda: hvd.Compression.powersgd(start_iter=0),
                "powersgd-unbatched": lambda: hvd.Compression.powersgd(start_iter=0, batch_tensors=False)}


def make_model(name):
    """digits: the main job's MLP (64-256-128-10, 6 tensors); deep80: 80 Linear(128, 128) layers (160 tensors);
    wide2: deep80's elements and multiply-adds in 2 tensors (Linear(128, 80 * 128))."""
    if name == "digits":
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                   torch.nn.ReLU(), torch.nn.Linear(128, 10)), 64
    if name == "wide2":
        return torch.nn.Linear(128, 80 * 128), 128
    layers = []
    for _ in range(80):
        layers += [torch.nn.Linear(128, 128), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]), 128


def compression_seconds(opt):
    total = opt.compression_stats()["total"]
    return total["compress_seconds"] + total["decompress_seconds"]


def run(model_name, compression, steps, warmup, cap):
    torch.manual_seed(0)
    model, features = make_model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the counts, not the training, are measured
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=COMPRESSIONS[compression](), bucket_cap_mb=cap)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(hvd.rank())
    totals = {"collectives": 0, "rounds": 0, "waits": 0, "blocked": 0}
    seconds = []
    for step in range(warmup + steps):
        COUNTER.reset()
        start = time.perf_counter()
        x = torch.randn(32, features, generator=gen)
        y = torch.randint(0, 10, (32,), generator=gen)
        opt.zero_grad()
        out = model(x)
        groups = out.shape[1] // 10  # every output's gradient (wide2's 10240, deep80's 120 of 128): dense gradients
        F.cross_entropy(out[:, :10 * groups].reshape(-1, 10), y.repeat_interleave(groups)).backward()
        opt.step()
        seconds.append(time.perf_counter() - start)
        if step == warmup - 1:
            spent = compression_seconds(opt)
        if step >= warmup:
            for field in totals:
                totals[field] += getattr(COUNTER, field)
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    return {"model": model_name, "compression": compression, "tensors": tensors, "steps": steps,
            "bucket_cap_mb": cap, "buckets": opt.compression_stats().get("buckets", tensors),
            "step_seconds": statistics.median(seconds[warmup:]),
            "compression_seconds_per_step": (compression_seconds(opt) - spent) / steps,
            **{f"{field}_per_step": value / steps for field, value in totals.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="digits,deep80")
    parser.add_argument("--compression", default=",".join(COMPRESSIONS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bucket-cap-mb", default="25", help="comma-separated caps, each a run")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    rows = [run(m, c, args.steps, args.warmup, float(cap)) for m in args.models.split(",")
            for c in args.compression.split(",") for cap in args.bucket_cap_mb.split(",")]
    if hvd.rank() == 0:
        with open(args.json, "w") as f:
            json.dump({"ranks": hvd.size(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
