"""Runs under horovodrun (inside a shaped namespace, benchmarks/auto.py): the median step time of Compression.auto
(after its choice has settled: its first three windows, the first choice and two trials, are not timed) and of each
static method at its defaults, and of PyTorch DDP's PowerSGD hook, on one model, each on its own copy of the model,
timed in interleaved rounds (timed_rounds). Rank 0 writes JSON to --json."""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import horovod_ext.torch as hvd  # noqa: E402
from baselines import ddp_wrap  # noqa: E402
from gravac_models import build  # noqa: E402
from link_worker import model_of  # noqa: E402

STATIC = {"none": lambda: hvd.Compression.none, "fp16": lambda: hvd.Compression.fp16,
          "ternary": lambda: hvd.Compression.ternary, "topk-1%": lambda: hvd.Compression.topk(ratio=0.01),
          "topk-10%": lambda: hvd.Compression.topk(ratio=0.1), "adaptive_topk": lambda: hvd.Compression.adaptive_topk,
          "powersgd-r4": lambda: hvd.Compression.powersgd(rank=4, start_iter=0),
          "auto": lambda: hvd.Compression.auto}
MODELS = ("mlp10m", "cnn", "nplm")


def model_and_batch(name, batch, seed):
    """(model, x, y, loss) of a model: the 10.5M-parameter MLP on random inputs, or gravac_models' CNN / nplm on a
    batch of their data."""
    if name == "mlp10m":
        torch.manual_seed(seed)
        model, width = model_of(10.5)
        return model, torch.randn(batch, width), torch.randint(0, 10, (batch,)), torch.nn.functional.cross_entropy
    model, (x, y, _, _), loss, _, _ = build(name, seed)
    return model, x[:batch], y[:batch], loss


def timed_rounds(steps, warm, most, budget, rounds):
    """The median step of each method (`steps`: method -> step), after its `warm` untimed steps, timed by `rounds`
    interleaved rounds: in each, every method in turn runs up to most / rounds timed steps, fewer (at least 1) once
    budget / rounds seconds have passed on the slowest rank; the host's drift over the run falls on every method
    alike."""
    for method, step in steps.items():
        for _ in range(warm[method]):
            step()
    times = {method: [] for method in steps}
    per_round = max(1, -(-most // rounds))
    for _ in range(rounds):
        for method, step in steps.items():
            spent = []
            while len(spent) < per_round:
                hvd.barrier()
                start = time.perf_counter()
                step()
                spent.append(time.perf_counter() - start)
                total = hvd.allreduce(torch.tensor([sum(spent)]), op=hvd.Max, name="auto_bench.spent").item()
                if total >= budget / rounds:
                    break
            times[method] += spent
    return {method: statistics.median(values) for method, values in times.items()}


def prepare(method, args):
    """(step, optimizer or None) of one method on its own copy of the model."""
    model, x, y, loss_fn = model_and_batch(args.model, args.batch, args.seed)
    if method == "ddp-powersgd":
        model, _, _ = ddp_wrap(model, "powersgd", hvd.rank(), hvd.size())
        opt, stats_of = torch.optim.SGD(model.parameters(), lr=0.01), None
    else:
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(),
                                       compression=STATIC[method]())
        stats_of = opt

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    return step, stats_of, sum(p.numel() for p in model.parameters())


def row_of(method, args, seconds, opt, parameters):
    row = {"method": method, "model": args.model, "ranks": hvd.size(), "parameters": parameters,
           "step_seconds": seconds}
    if opt is not None:
        stats = opt.compression_stats()
        row["ratio"] = stats["total"]["ratio"]
        if method == "auto":
            row["choice"] = {n: e["method"].split("(")[0]
                             + (f"({e['method'].split('ratio=')[1].split(',')[0].rstrip(')')})"
                                if "ratio=" in e["method"] else "")
                             for n, e in stats["choice"].items()}
            row["predicted_step_seconds"] = stats["predicted_step_seconds"]
            row["choice_changes"] = stats["choice_changes"]
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--methods", default=",".join(list(STATIC) + ["ddp-powersgd"]))
    parser.add_argument("--steps", type=int, default=15, help="the most timed steps per method")
    parser.add_argument("--budget", type=float, default=15.0,
                        help="seconds of timed steps per method (one step a round at least)")
    parser.add_argument("--settle", type=int, default=61, help="auto's untimed steps (its first three windows)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of timed steps")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    methods = args.methods.split(",")
    prepared = {method: prepare(method, args) for method in methods}
    # auto: its first three windows; the hook compresses from its 2nd iteration; the others' first step agrees settings
    warm = {method: {"auto": args.settle, "ddp-powersgd": 3}.get(method, 1) for method in methods}
    seconds = timed_rounds({m: prepared[m][0] for m in methods}, warm, args.steps, args.budget, args.rounds)
    rows = [row_of(method, args, seconds[method], *prepared[method][1:]) for method in methods]
    if hvd.rank() == 0:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
