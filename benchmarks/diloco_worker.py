"""The low-communication benchmark's runs (benchmarks/diloco.py), under horovodrun: each method trains the
transformer language model of lm.py with AdamW from the same start, each rank on its own batches, and rank 0
records the test loss against training seconds and its bytes on the wire (wire.py's ring formulas; the payload
beside them).

Methods: "dense" (data-parallel AdamW: horovod_ext's DistributedOptimizer, Compression.none), "ternary" and
"topk" (the same with ternary, and top-k 1% with error feedback), "powersgd-hook" (PyTorch DDP with its PowerSGD
hook at rank 4, baselines.py), "lsgd" (LeaderOptimizer around AdamW, one leader, its defaults), "diloco"
(DiLoCoOptimizer around AdamW, dense pseudo-gradients), "diloco-ternary" and "diloco-topk" (ternary with error
feedback, top-k 1%); a DiLoCo method may also name its inner steps, outer learning rate and momentum, Streaming DiLoCo's
fragments, overlap and merge, and groups="node" (benchmarks/diloco_methods.py; inner steps default to --inner-steps).
"local": AdamW alone on each rank, no collective: the compute-alone step time. The test loss is the model's (LSGD:
the leader's; DiLoCo: the outer parameters', evaluation_parameters()) on the first --eval-sequences test sequences,
every --eval-every steps and at the end; evaluation is not counted in the training seconds. With --adapter ddp
(under torchrun: horovod_ext.ddp over torch.distributed, no Horovod) the DiLoCo methods and "local" run.
"""
import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lm  # noqa: E402
from baselines import ddp_wrap  # noqa: E402
from diloco_methods import COMPRESSIONS, diloco_optimizer, diloco_settings, is_diloco  # noqa: E402
from horovod_ext.compression.wire import allreduce_wire_bytes  # noqa: E402

BASE_METHODS = ["dense", "ternary", "topk", "powersgd-hook", "lsgd", "local", "diloco", "diloco-ternary",
                "diloco-topk"]


def check_method(method):
    return is_diloco(method) or method in BASE_METHODS


BYTES = ("payload_bytes", "wire_bytes", "dense_bytes", "dense_wire_bytes")


def ddp_step_bytes(payload, wire, dense, nranks):
    """A DDP method's bytes per step (BYTES): its hook's payload and wire bytes; the dense reference, Horovod's ring
    allreduce of the float32 gradients, 2 (N-1)/N * dense on the wire."""
    return dict(zip(BYTES, (payload, wire, dense, allreduce_wire_bytes(dense, nranks))))


class Horovod:
    """The worker's job over Horovod (horovodrun): rank, size, the start's broadcast, the adapter."""

    def __init__(self):
        import horovod_ext.torch as hvd
        hvd.init()
        self.hx, self.rank, self.size = hvd, hvd.rank(), hvd.size()

    def broadcast_parameters(self, model):
        self.hx.broadcast_parameters(model.state_dict(), root_rank=0)


class TorchDistributed:
    """The worker's job over torch.distributed (torchrun): horovod_ext.ddp, no Horovod."""

    def __init__(self):
        import torch.distributed as dist
        import horovod_ext.ddp as hx
        dist.init_process_group("gloo")
        self.hx, self.rank, self.size, self.dist = hx, dist.get_rank(), dist.get_world_size(), dist

    def broadcast_parameters(self, model):
        for tensor in model.state_dict().values():
            self.dist.broadcast(tensor, src=0)


JOB = None  # the launcher's job, made in main()


def optimizer_for(method, model, inner_steps):
    """(optimizer, its schedule, the model to call, the bytes per step (BYTES) of a method without
    compression_stats(), or None)."""
    inner, schedule = lm.inner_optimizer(model)
    named = model.named_parameters()
    hvd = JOB.hx
    if is_diloco(method):
        return diloco_optimizer(method, inner, named, inner_steps, hx=hvd), schedule, model, None
    if method == "powersgd-hook":
        ddp, payload, wire = ddp_wrap(model, "powersgd", JOB.rank, JOB.size)
        dense = 4 * sum(p.numel() for p in model.parameters())
        return inner, schedule, ddp, ddp_step_bytes(payload, wire, dense, JOB.size)
    if method == "lsgd":
        return hvd.LeaderOptimizer(inner, named, groups=None), schedule, model, None
    if method == "local":
        return inner, schedule, model, dict.fromkeys(BYTES, 0)
    compression = COMPRESSIONS["none" if method == "dense" else method](hvd)
    return hvd.DistributedOptimizer(inner, named, compression=compression), schedule, model, None


def train(args, method):
    model, (x, y, x_test, y_test) = lm.build(seed=42 if args.seed == 1 else args.seed, context=args.context,
                                             layers=args.layers)
    opt, schedule, forward, ddp_bytes = optimizer_for(method, model, args.inner_steps)
    JOB.broadcast_parameters(model)
    step = 0

    def sent_bytes():
        """This rank's bytes so far (BYTES): every collective's payload and wire bytes (compression_stats()'s
        total), and the dense reference's."""
        if ddp_bytes is not None:
            return {k: v * step for k, v in ddp_bytes.items()}
        total = opt.compression_stats()["total"]
        return {k: total[k] for k in BYTES}

    x_test, y_test = x_test[:args.eval_sequences], y_test[:args.eval_sequences]
    gen = torch.Generator().manual_seed(1000 * args.seed + JOB.rank)
    curve, seconds = [], 0.0

    def evaluate(step):
        # DiLoCo: the outer parameters; LSGD: the leader's (collective); data-parallel: the model as it is
        swapped = opt.evaluation_parameters() if hasattr(opt, "evaluation_parameters") else contextlib.nullcontext()
        with swapped:
            loss, accuracy = lm.evaluate(model, x_test, y_test)
        sent = sent_bytes()
        curve.append({"step": step, "seconds": seconds, "bytes": sent["wire_bytes"],
                      "payload_bytes": sent["payload_bytes"], "loss": loss, "accuracy": accuracy})

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
    stats = opt.compression_stats() if hasattr(opt, "compression_stats") else {}
    return {"method": method, "train_seconds": seconds,
            "peak_exchange_bytes": stats.get("peak_exchange_payload_bytes"), "ranks": JOB.size,
            "parameters": sum(p.numel() for p in model.parameters()),
            "inner_steps": diloco_settings(method, args.inner_steps)["inner_steps"] if is_diloco(method) else None,
            "curve": curve, **sent_bytes(), "steps": args.steps}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", required=True, help=f"comma-separated, each one of {BASE_METHODS} or a DiLoCo "
                                                          "method of diloco_methods.py")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--inner-steps", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-sequences", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1, help="the model's initialization is lm.build's seed 42 for "
                                                             "seed 1, else this seed; the batches' draws follow it")
    parser.add_argument("--adapter", choices=["horovod", "ddp"], default="horovod",
                        help="horovod: horovod_ext.torch under horovodrun; ddp: horovod_ext.ddp under torchrun "
                             "(DiLoCo methods and local only)")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    args.methods = args.method.split(",")
    unknown = [m for m in args.methods if not check_method(m) or
               (args.adapter == "ddp" and not (is_diloco(m) or m == "local"))]
    if unknown:
        parser.error(f"--method: {unknown} not among {BASE_METHODS} nor DiLoCo methods (--adapter ddp: DiLoCo "
                     "methods and local) "
                     "(diloco[-ternary|-topk][-h<H>][-lr<x>][-m<x>][-p<P>][-t<tau>][-a<alpha>][-leader][-node])")
    return args


def main():
    global JOB
    args = parse_args()
    JOB = TorchDistributed() if args.adapter == "ddp" else Horovod()
    torch.set_num_threads(1)
    results = [train(args, method) for method in args.methods]
    if JOB.rank == 0:
        with open(args.json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
