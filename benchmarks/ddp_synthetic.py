"""Horovod's pytorch_synthetic_benchmark.py written for DDP under torchrun: a torchvision model (ResNet-50 by
default) on fixed random images, SGD at lr 0.01, batch 64 per rank, timed as Horovod's script times it (warm-up
batches, then iterations of batches, images/s their mean). One model per hook, from the same weights: DDP without a
hook, torch's fp16 and PowerSGD hooks, and horovod-ext's (examples/ddp_digits.py's table of hooks). For horovod-ext's
hooks, the seconds a timed step spends compressing and decompressing (compression_stats(); set HVDEXT_SYNC_TIMING=1
on a GPU, so that each timed block waits for the device and holds its kernels' time) and that as a share of the step.

    torchrun --standalone --nproc_per_node 1 benchmarks/ddp_synthetic.py --hooks ddp,torch-powersgd,ternary,topk-1%
"""
import argparse
import json
import os
import sys
import timeit

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from ddp_digits import OURS, TORCH, hooked  # noqa: E402  (the hooks, one table for the example and this)

SPENT = ("compress_seconds", "decompress_seconds")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hooks", default="ddp,torch-powersgd,ternary,topk-1%,powersgd",
                        help=f"comma-separated list of {', '.join(TORCH + tuple(OURS))}")
    parser.add_argument("--model", default="resnet50", help="a torchvision.models name (default resnet50)")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP's bucket_cap_mb (default 25)")
    parser.add_argument("--no-cuda", action="store_true", help="train on the CPU where a GPU is")
    parser.add_argument("--backend", default=None, help="torch.distributed backend (default: nccl on CUDA, else gloo)")
    parser.add_argument("--json", default=None, help="rank 0 writes the results here")
    args = parser.parse_args()
    args.hooks = args.hooks.split(",")
    unknown = [h for h in args.hooks if h not in TORCH and h not in OURS]
    if unknown:
        parser.error(f"--hooks: unknown {unknown}; allowed values are {', '.join(TORCH + tuple(OURS))}")
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    args.backend = args.backend or ("nccl" if args.cuda else "gloo")
    return args


def spent(state):
    """Seconds horovod-ext's hook has spent compressing and decompressing so far (0 for the others)."""
    if state is None:
        return 0.0
    total = state.compression_stats()["total"]
    return sum(total[field] for field in SPENT)


def measure(args, hook, device):
    """{hook, images_per_second, step_ms, compression_ms, ...} of one model trained with `hook`."""
    from torchvision import models

    torch.manual_seed(0)
    model = getattr(models, args.model)()
    if args.cuda:  # as Horovod's script's hvd.SyncBatchNorm (torch's takes GPU modules only)
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    model, state = hooked(model, hook, args.bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    target = (torch.arange(args.batch_size, device=device) * 7919) % 1000

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    def timed(batches):
        start = timeit.default_timer()
        for _ in range(batches):
            step()
        if args.cuda:
            torch.cuda.synchronize()
        return timeit.default_timer() - start

    timed(args.num_warmup_batches)
    before = spent(state)
    seconds = [timed(args.num_batches_per_iter) for _ in range(args.num_iters)]
    steps = args.num_batches_per_iter * args.num_iters
    compression_ms = 1000 * (spent(state) - before) / steps
    step_ms = 1000 * sum(seconds) / steps
    images = [args.batch_size * args.num_batches_per_iter / s for s in seconds]
    result = {"hook": hook, "images_per_second": sum(images) / len(images), "step_ms": step_ms,
              "compression_ms": compression_ms if state is not None else None}
    if state is not None:
        total = state.compression_stats()["total"]
        result["ratio"] = total["ratio"]
        result["buckets"] = state.compression_stats().get("buckets")
    return result


def table(args, results):
    lines = [f"{args.model}, batch {args.batch_size} per rank, DDP over {args.backend.upper()}, "
             f"{dist.get_world_size()} rank(s), bucket_cap_mb {args.bucket_cap_mb:g}", "",
             "| hook | img/s | vs DDP | step ms | compression ms | of the step | payload ratio |",
             "|---|---|---|---|---|---|---|"]
    ddp = next((r["images_per_second"] for r in results if r["hook"] == "ddp"), None)
    for r in results:
        share = "-" if r["compression_ms"] is None else f"{100 * r['compression_ms'] / r['step_ms']:.1f}%"
        kernels = "-" if r["compression_ms"] is None else f"{r['compression_ms']:.2f}"
        ratio = f"{r['ratio']:.1f}x" if r.get("ratio") else "-"
        versus = f"{r['images_per_second'] / ddp:.2f}x" if ddp else "-"
        lines.append(f"| {r['hook']} | {r['images_per_second']:.1f} | {versus} | {r['step_ms']:.1f} | {kernels} | "
                     f"{share} | {ratio} |")
    return "\n".join(lines)


def main():
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        torch.backends.cudnn.benchmark = True
    dist.init_process_group(args.backend)
    device = torch.device("cuda", torch.cuda.current_device()) if args.cuda else torch.device("cpu")
    results = []
    for hook in args.hooks:
        results.append(measure(args, hook, device))
        if args.cuda:
            torch.cuda.empty_cache()  # the last hook's model is gone with measure's frame
        if dist.get_rank() == 0:
            print(f"[ddp_synthetic] {results[-1]}", flush=True)
    if dist.get_rank() == 0:
        print(table(args, results), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": dist.get_world_size(), "results": results}, f, indent=1)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # Gloo's teardown with a communication hook can abort (examples/ddp_digits.py says why)


if __name__ == "__main__":
    main()
