"""Runs under horovodrun: trains one of benchmarks/gravac_models.py's models (the digits MLP by default, of width
--hidden) with each listed method in turn (one launch for several runs; each run starts from the same model and data
order) and records, per run, test accuracy against training time and rank 0's bytes on the wire (wire.py's ring
formulas, every collective of the method: compression_stats()'s total) after every epoch, the step time and the wire and
payload bytes per step (--json: a list, one entry per method). Methods: horovod_ext compressors (data-parallel SGD),
horovod_ext's parameter-space optimizers (LSGD, multi-leader LSGD, EASGD, DiLoCo: each worker samples from the whole
training set, and the leader's parameters, the center or DiLoCo's outer parameters are evaluated), or PyTorch DDP dense,
with its fp16 hook or its PowerSGD hook (rank 4; see baselines.py)."""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gravac_models import MODELS, build  # noqa: E402

import horovod_ext.torch as hvd  # noqa: E402
from baselines import DDP_METHODS, ddp_wrap  # noqa: E402
from diloco_methods import diloco_optimizer, is_diloco  # noqa: E402
from horovod_ext.compression.wire import allreduce_wire_bytes  # noqa: E402

METHODS = {"dense": lambda: hvd.Compression.none, "fp16": lambda: hvd.Compression.fp16,
           "topk-10x": lambda: hvd.Compression.topk(ratio=0.1), "topk-20x": lambda: hvd.Compression.topk(ratio=0.05),
           "topk-100x": lambda: hvd.Compression.topk(ratio=0.01),
           "topk-1000x": lambda: hvd.Compression.topk(ratio=0.001),
           "adaptive_topk": lambda: hvd.Compression.adaptive_topk,  # GraVAC at its defaults
           "auto": lambda: hvd.Compression.auto,  # per tensor, at its defaults
           "ternary": lambda: hvd.Compression.ternary,
           # the fixed packing perfmodel plans (benchmarks/perfmodel_validation.py)
           "ternary-base3": lambda: hvd.Compression.ternary(packing="base3"),
           "ternary-2phase": lambda: hvd.Compression.ternary(packing="base3", shared_scale=True,
                                                             transport="two_phase"),
           # Compression.powersgd at its defaults (rank 4); "powersgd" is PyTorch DDP's hook (baselines.py)
           "hvdext-powersgd": lambda: hvd.Compression.powersgd,
           # compressing from the step baselines.py's hook starts at (its start_powerSGD_iter=2)
           "hvdext-powersgd-start2": lambda: hvd.Compression.powersgd(start_iter=2)}
OPTIMIZERS = {"lsgd": lambda opt, named: hvd.LeaderOptimizer(opt, named, groups=None),
              "multi_lsgd": lambda opt, named: hvd.LeaderOptimizer(opt, named, groups="node"),
              "easgd": lambda opt, named: hvd.ElasticAveragingOptimizer(opt, named),
              "async_lsgd": lambda opt, named: hvd.LeaderOptimizer(opt, named, groups=None, asynchronous=True),
              "async_multi_lsgd": lambda opt, named: hvd.LeaderOptimizer(opt, named, groups="node",
                                                                         asynchronous=True),
              "async_easgd": lambda opt, named: hvd.ElasticAveragingOptimizer(opt, named, asynchronous=True)}
LEADERS = {"lsgd", "multi_lsgd", "async_lsgd", "async_multi_lsgd"}  # also evaluated at the center variable
COMPUTE = "compute"  # compute alone: each rank trains its own model, no collective in a step (the lower bound)


def block_step_seconds(times, block=4):
    """The median over consecutive blocks of `block` steps of each block's mean step: robust to the odd slow step
    (a scheduler hiccup on a loaded host, which the mean keeps), yet it keeps a periodic method's communicating
    step (LSGD and EASGD communicate every 4th step at their default period, which a median of steps would hide)."""
    blocks = [statistics.fmean(times[i:i + block]) for i in range(0, len(times) - block + 1, block)]
    return statistics.median(blocks) if blocks else statistics.fmean(times)


def train(args, method):
    """One run: `method` from the model's initial weights; the result rank 0 records."""
    model, (x_train, y_train, x_test, y_test), loss_fn, accuracy_of, lr = build(args.model, seed=args.seed,
                                                                                hidden=args.hidden)
    base_lr = args.lr or lr
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9)
    if method in DDP_METHODS:
        model, payload, wire = ddp_wrap(model, method, hvd.rank(), hvd.size())
    elif method in OPTIMIZERS or is_diloco(method):  # DiLoCo around the SGD, named as diloco_methods.py says
        make = OPTIMIZERS.get(method, lambda opt, named: diloco_optimizer(method, opt, named))
        optimizer = make(optimizer, model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    elif method == COMPUTE:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    else:
        compression = METHODS[method]()
        if args.adaptive:
            compression = compression(**{k: type(getattr(compression, k))(v) if not isinstance(
                getattr(compression, k), str) else v for k, v in (a.split("=") for a in args.adaptive.split(","))})
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    parameter_space = method in OPTIMIZERS or is_diloco(method)
    shard = torch.arange(hvd.rank(), len(x_train), hvd.size())[:len(x_train) // hvd.size()]
    gen = torch.Generator().manual_seed(1000 * args.seed + hvd.rank())
    train_seconds, curve, step_times, cf_log, step = 0.0, [], [], [], 0

    def evaluate(epoch):
        evaluated = optimizer.evaluation_parameters() if parameter_space else contextlib.nullcontext()
        with torch.no_grad(), evaluated:  # LSGD: the best worker; EASGD: the center
            accuracy = accuracy_of(model, x_test, y_test)
            test_loss = loss_fn(model(x_test), y_test).item()  # the language models' log-perplexity
        if method in DDP_METHODS or method == COMPUTE:
            sent = {"payload_bytes": payload * step, "wire_bytes": wire * step} if method in DDP_METHODS else \
                {"payload_bytes": 0, "wire_bytes": 0}
        else:
            sent = optimizer.compression_stats()["total"]
        curve.append({"epoch": epoch, "step": step, "seconds": train_seconds, "accuracy": accuracy,
                      "bytes": sent["wire_bytes"], "payload_bytes": sent["payload_bytes"], "loss": test_loss})
        if method in LEADERS:  # the paper's figures evaluate the center variable (the workers' average)
            with torch.no_grad(), optimizer.evaluation_parameters(which="center"):
                curve[-1]["center_accuracy"] = accuracy_of(model, x_test, y_test)

    for epoch in range(args.epochs):
        hvd.barrier()
        start = time.perf_counter()
        if parameter_space or method == COMPUTE:  # every worker samples from the whole set
            order = torch.randperm(len(x_train), generator=gen)[:len(shard)]
        else:
            order = shard[torch.randperm(len(shard), generator=gen)]
        for i in range(0, len(order) - 31, 32):
            idx = order[i:i + 32]
            t0 = time.perf_counter()
            if args.schedule == "cosine":
                for group in optimizer.param_groups:
                    group["lr"] = base_lr * (1 + math.cos(math.pi * step / args.steps)) / 2
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[idx]), y_train[idx])
            loss.backward()
            if hasattr(optimizer, "report_loss"):  # LSGD's election, EASGD's
                optimizer.report_loss(loss)
            optimizer.step()
            step_times.append(time.perf_counter() - t0)
            step += 1
            if method.startswith("adaptive_topk"):  # the controller's log keeps the last window: read each step
                cf_log.append(optimizer.compression_stats()["cf"])
            if (args.eval_every and step % args.eval_every == 0) or step == args.steps:
                hvd.barrier()
                train_seconds += time.perf_counter() - start
                evaluate(epoch + i / len(order))
                if step == args.steps:
                    break
                hvd.barrier()
                start = time.perf_counter()
        if step == args.steps:
            break
        hvd.barrier()
        train_seconds += time.perf_counter() - start
        if not args.eval_every:
            evaluate(epoch + 1)
    result = {"method": method, "model": args.model, "seed": args.seed, "adaptive": args.adaptive,
              "schedule": args.schedule,
              "ranks": hvd.size(), "hidden": args.hidden,
              "parameters": sum(p.numel() for p in model.parameters()), "curve": curve,
              # the mean: periodic methods (LSGD, EASGD) communicate on some steps only, which a median would hide
              "step_seconds": statistics.fmean(step_times[5:] or step_times),
              "median_step_seconds": statistics.median(step_times[5:] or step_times),
              "block_step_seconds": block_step_seconds(step_times[5:] or step_times)}
    if method in DDP_METHODS:
        result.update(payload_bytes=payload, wire_bytes=wire)
    elif method == COMPUTE:
        result.update(payload_bytes=0.0, wire_bytes=0.0)
    else:
        stats = optimizer.compression_stats()
        total, steps = stats["total"], max(stats["steps"], 1)
        result.update(payload_bytes=total["payload_bytes"] / steps, wire_bytes=total["wire_bytes"] / steps,
                      cf_log=cf_log,
                      throughput={str(k): v for k, v in stats.get("throughput", {}).items()},
                      theta_ideal=stats.get("theta_ideal"), comm_seconds=total["comm_seconds"] / steps,
                      compression_seconds=(total["compress_seconds"] + total["decompress_seconds"]) / steps)
    result["dense_bytes"] = 4 * result["parameters"]  # data-parallel SGD's float32 allreduce, per step
    result["dense_wire_bytes"] = allreduce_wire_bytes(result["dense_bytes"], hvd.size())
    return result


ALL_METHODS = list(METHODS) + list(OPTIMIZERS) + list(DDP_METHODS) + [COMPUTE]


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", required=True, help=f"comma-separated, each one of {ALL_METHODS} or a DiLoCo "
                                                          "method of diloco_methods.py")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--model", choices=MODELS, default="mlp")
    parser.add_argument("--hidden", type=int, default=1024, help="the MLP's width")
    parser.add_argument("--lr", type=float, default=None, help="default: the model's own (gravac_models.py)")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: --epochs whole)")
    parser.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                        help="cosine: lr_t = lr (1 + cos(pi t / T)) / 2 over the T = --steps steps (so the curves "
                             "settle and the final accuracy is a target a method can reach)")
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate every this many steps (0: each epoch)")
    parser.add_argument("--seed", type=int, default=42, help="the model's initialization and data order")
    parser.add_argument("--adaptive", default="", help="adaptive_topk's arguments, e.g. epsilon=0.5,window=50")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    args.methods = args.method.split(",")
    unknown = [m for m in args.methods if m not in ALL_METHODS and not is_diloco(m)]
    if unknown:
        parser.error(f"--method: {unknown} not among {ALL_METHODS}")
    if args.schedule == "cosine" and not args.steps:
        parser.error("--schedule cosine needs --steps (the T it anneals over)")
    return args


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    results = [train(args, method) for method in args.methods]
    if hvd.rank() == 0:
        with open(args.json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
