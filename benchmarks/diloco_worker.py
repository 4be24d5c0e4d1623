"""The low-communication benchmark's runs (benchmarks/diloco.py), under horovodrun: each method trains the
transformer language model of lm.py with AdamW from the same start, each rank on its own batches, and rank 0
records the test loss against training seconds and bytes sent.

Methods: "dense" (data-parallel AdamW: horovod_ext's DistributedOptimizer, Compression.none), "ternary" and
"topk" (the same with ternary, and top-k 1% with error feedback), "powersgd-hook" (PyTorch DDP with its PowerSGD
hook at rank 4, baselines.py), "lsgd" (LeaderOptimizer around AdamW, one leader, its defaults), "diloco"
(DiLoCoOptimizer around AdamW, dense pseudo-gradients), "diloco-ternary" and "diloco-topk" (ternary with error
feedback, top-k 1%). A DiLoCo method may end in "-h<H>" (its inner steps; default --inner-steps) and "-node"
(groups="node": a host's ranks are one worker). The test loss is the model's (LSGD: the leader's; DiLoCo: the outer
parameters', evaluation_parameters()) on the first --eval-sequences test sequences, every --eval-every steps and at
the end; evaluation is not counted in the training seconds.
"""
import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import horovod_ext.torch as hvd  # noqa: E402
import lm  # noqa: E402
from baselines import ddp_wrap  # noqa: E402

COMPRESSIONS = {"none": lambda: hvd.Compression.none,
                "ternary": lambda: hvd.Compression.ternary(error_feedback=True),
                "topk": lambda: hvd.Compression.topk(ratio=0.01)}
BASE_METHODS = ["dense", "ternary", "topk", "powersgd-hook", "lsgd", "diloco", "diloco-ternary", "diloco-topk"]


def diloco_options(method, inner_steps):
    """A DiLoCo method's (compression name, inner steps, groups): diloco[-ternary|-topk][-h<H>][-node]."""
    parts = method.split("-")[1:]
    groups = "node" if "node" in parts else None
    steps = next((int(p[1:]) for p in parts if p.startswith("h") and p[1:].isdigit()), inner_steps)
    compression = next((p for p in parts if p in COMPRESSIONS), "none")
    return compression, steps, groups


def check_method(method):
    if method.startswith("diloco"):
        parts = method.split("-")[1:]
        return all(p in COMPRESSIONS or p == "node" or (p.startswith("h") and p[1:].isdigit()) for p in parts)
    return method in BASE_METHODS


def optimizer_for(method, model, inner_steps):
    """(optimizer, its schedule, the model to call, DDP's bytes per step or None)."""
    inner, schedule = lm.inner_optimizer(model)
    named = model.named_parameters()
    if method.startswith("diloco"):
        compression, steps, groups = diloco_options(method, inner_steps)
        return hvd.DiLoCoOptimizer(inner, named, inner_steps=steps, compression=COMPRESSIONS[compression](),
                                   groups=groups), schedule, model, None
    if method == "powersgd-hook":
        ddp, payload, _ = ddp_wrap(model, "powersgd", hvd.rank(), hvd.size())
        return inner, schedule, ddp, (payload, 4 * sum(p.numel() for p in model.parameters()))
    if method == "lsgd":
        return hvd.LeaderOptimizer(inner, named, groups=None), schedule, model, None
    compression = COMPRESSIONS["none" if method == "dense" else method]()
    return hvd.DistributedOptimizer(inner, named, compression=compression), schedule, model, None


def train(args, method):
    model, (x, y, x_test, y_test) = lm.build(context=args.context, layers=args.layers)
    opt, schedule, forward, ddp_bytes = optimizer_for(method, model, args.inner_steps)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    step = 0

    def sent_bytes():
        """(payload, dense) bytes this rank handed to collectives so far."""
        if ddp_bytes is not None:
            return ddp_bytes[0] * step, ddp_bytes[1] * step
        total = opt.compression_stats()["total"]
        return total["payload_bytes"], total["dense_bytes"]

    x_test, y_test = x_test[:args.eval_sequences], y_test[:args.eval_sequences]
    gen = torch.Generator().manual_seed(1000 + hvd.rank())
    curve, seconds = [], 0.0

    def evaluate(step):
        # DiLoCo: the outer parameters; LSGD: the leader's (collective); data-parallel: the model as it is
        swapped = opt.evaluation_parameters() if hasattr(opt, "evaluation_parameters") else contextlib.nullcontext()
        with swapped:
            loss, accuracy = lm.evaluate(model, x_test, y_test)
        sent = sent_bytes()[0]
        curve.append({"step": step, "seconds": seconds, "bytes": sent, "loss": loss, "accuracy": accuracy})

    evaluate(0)
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        batch = torch.randint(len(x), (args.batch,), generator=gen)
        opt.zero_grad()
        loss = lm.loss_fn(forward(x[batch]), y[batch])
        loss.backward()
        if hasattr(opt, "report_loss"):
            opt.report_loss(loss)
        opt.step()
        schedule.step()
        seconds += time.perf_counter() - start
        if step % args.eval_every == 0 or step == args.steps:
            evaluate(step)
    payload, dense = sent_bytes()
    return {"method": method, "ranks": hvd.size(), "parameters": sum(p.numel() for p in model.parameters()),
            "inner_steps": diloco_options(method, args.inner_steps)[1] if method.startswith("diloco") else None,
            "curve": curve, "payload_bytes": payload, "dense_bytes": dense, "steps": args.steps}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", required=True, help=f"comma-separated, each one of {BASE_METHODS}, a DiLoCo "
                                                          "method with -h<H> or -node")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--inner-steps", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-sequences", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    args.methods = args.method.split(",")
    unknown = [m for m in args.methods if not check_method(m)]
    if unknown:
        parser.error(f"--method: {unknown} not among {BASE_METHODS} (DiLoCo's with -h<H>, -node)")
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
