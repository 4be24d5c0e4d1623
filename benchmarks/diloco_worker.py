"""The low-communication benchmark's runs (benchmarks/diloco.py), under horovodrun: each method trains the
transformer language model of lm.py with AdamW from the same start, each rank on its own batches, and rank 0
records the test loss against training seconds and bytes sent.

Methods: "dense" (data-parallel AdamW: horovod_ext's DistributedOptimizer, Compression.none), "ternary" and
"topk" (the same with ternary, and top-k 1% with error feedback), "diloco" (DiLoCoOptimizer around AdamW, dense
pseudo-gradients), "diloco-ternary" and "diloco-topk" (ternary with error feedback, top-k 1%). The test loss is
the model's (for DiLoCo the outer parameters', evaluation_parameters()) on the first --eval-sequences test
sequences, every --eval-every steps and at the end; evaluation is not counted in the training seconds.
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

COMPRESSIONS = {"none": lambda: hvd.Compression.none,
                "ternary": lambda: hvd.Compression.ternary(error_feedback=True),
                "topk": lambda: hvd.Compression.topk(ratio=0.01)}
METHODS = ["dense", "ternary", "topk", "diloco", "diloco-ternary", "diloco-topk"]


def optimizer_for(method, model, inner_steps):
    inner, schedule = lm.inner_optimizer(model)
    named = model.named_parameters()
    if method.startswith("diloco"):
        compression = COMPRESSIONS[method.partition("-")[2] or "none"]()
        return hvd.DiLoCoOptimizer(inner, named, inner_steps=inner_steps, compression=compression), schedule
    compression = COMPRESSIONS["none" if method == "dense" else method]()
    return hvd.DistributedOptimizer(inner, named, compression=compression), schedule


def train(args, method):
    model, (x, y, x_test, y_test) = lm.build(context=args.context, layers=args.layers)
    opt, schedule = optimizer_for(method, model, args.inner_steps)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x_test, y_test = x_test[:args.eval_sequences], y_test[:args.eval_sequences]
    gen = torch.Generator().manual_seed(1000 + hvd.rank())
    curve, seconds = [], 0.0

    def evaluate(step):
        # DiLoCo: the outer parameters; data-parallel: the model as it is
        swapped = opt.evaluation_parameters() if hasattr(opt, "evaluation_parameters") else contextlib.nullcontext()
        with swapped:
            loss, accuracy = lm.evaluate(model, x_test, y_test)
        sent = opt.compression_stats()["total"]["payload_bytes"]
        curve.append({"step": step, "seconds": seconds, "bytes": sent, "loss": loss, "accuracy": accuracy})

    evaluate(0)
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        batch = torch.randint(len(x), (args.batch,), generator=gen)
        opt.zero_grad()
        lm.loss_fn(model(x[batch]), y[batch]).backward()
        opt.step()
        schedule.step()
        seconds += time.perf_counter() - start
        if step % args.eval_every == 0 or step == args.steps:
            evaluate(step)
    stats = opt.compression_stats()
    return {"method": method, "ranks": hvd.size(), "parameters": sum(p.numel() for p in model.parameters()),
            "inner_steps": args.inner_steps if method.startswith("diloco") else None, "curve": curve,
            "payload_bytes": stats["total"]["payload_bytes"], "dense_bytes": stats["total"]["dense_bytes"],
            "steps": args.steps}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", required=True, help=f"comma-separated, each one of {METHODS}")
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
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"--method: {unknown} not among {METHODS}")
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
