"""Data-parallel training of an MLP on scikit-learn's digits with PyTorch DDP under torchrun: horovod-ext's
communication hooks (horovod_ext.ddp, no Horovod) beside DDP's own averaging and torch's fp16 and PowerSGD hooks.

    torchrun --standalone --nproc_per_node 2 examples/ddp_digits.py --hook ddp,ternary,topk,torch-powersgd

Every rank trains on its shard of the training set (the shards and the order of examples/pytorch_digits.py); the
script trains one model per listed hook from the same initial weights and data order, and rank 0 prints test
accuracy, seconds per step and bytes per step beside each other. The horovod-ext-specific lines are the import and
the two lines that register the hook (``hooked``).
"""
import argparse
import json
import os
import sys
import time
import zlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

import horovod_ext.ddp as hx
from horovod_ext.compression.wire import allreduce_wire_bytes
from horovod_ext.perfmodel import plan
from digits_data import add_training_arguments, make_model, training_data

OURS = {"none": lambda: hx.Compression.none, "fp16": lambda: hx.Compression.fp16,
        "ternary": lambda: hx.Compression.ternary,
        "topk": lambda: hx.Compression.topk(ratio=0.1),
        "topk-1%": lambda: hx.Compression.topk(ratio=0.01),
        "adaptive_topk": lambda: hx.Compression.adaptive_topk,
        "powersgd": lambda: hx.Compression.powersgd,
        "auto": lambda: hx.Compression.auto}
TORCH = ("ddp", "torch-fp16", "torch-powersgd")  # DDP without a hook; torch's fp16 hook; its PowerSGD hook (rank 4)
TORCH_POWERSGD_RANK, TORCH_POWERSGD_START = 4, 3


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hook", default="ddp,ternary",
                        help=f"comma-separated list of {', '.join(TORCH + tuple(OURS))} (default: ddp,ternary)")
    add_training_arguments(parser)
    parser.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP's bucket_cap_mb (default 25, DDP's)")
    args = parser.parse_args()
    args.hook = args.hook.split(",")
    unknown = [h for h in args.hook if h not in TORCH and h not in OURS]
    if unknown:
        parser.error(f"--hook: unknown {unknown}; allowed values are {', '.join(TORCH + tuple(OURS))}")
    return args


def hooked(model, hook, bucket_cap_mb=25):
    """model in DDP with `hook`; the hook's state (horovod-ext's, with compression_stats(); else None)."""
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    if hook in OURS:
        state = hx.CompressionState(OURS[hook](), named_parameters=ddp.named_parameters())
        ddp.register_comm_hook(state, hx.comm_hook)
        return ddp, state
    if hook == "torch-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "torch-powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=TORCH_POWERSGD_RANK,
                                            start_powerSGD_iter=TORCH_POWERSGD_START)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp, None


def torch_hook_bytes(model, hook, nranks):
    """(payload, dense) bytes a step of torch's hook allreduces per rank (PowerSGD's from horovod_ext.perfmodel's
    plan of the hook: its compressed steps, after start_powerSGD_iter)."""
    dense = sum(4 * p.numel() for p in model.parameters())
    if hook == "torch-fp16":
        return dense // 2, dense
    if hook == "torch-powersgd":
        transfers = plan("powersgd", [tuple(p.shape) for p in model.parameters()], 1, rank=TORCH_POWERSGD_RANK,
                         min_compression_rate=2, hook=True)
        return sum(t.payload for t in transfers), dense
    return dense, dense


def train(args, hook, data):
    x_train, y_train, x_test, y_test = data
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model, state = hooked(make_model(args.hidden).to(x_train.device), hook, args.bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    shard = torch.arange(rank, len(x_train), size)
    gen = torch.Generator().manual_seed(args.seed + rank)
    steps = 0
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.epochs):
        order = shard[torch.randperm(len(shard), generator=gen)]
        for i in range(0, len(order) - args.batch_size + 1, args.batch_size):
            idx = order[i:i + args.batch_size]
            optimizer.zero_grad()
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            optimizer.step()
            steps += 1
    seconds = time.perf_counter() - start
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    root = flat.clone()
    dist.broadcast(root, 0)
    spread = (flat - root).abs().max().reshape(1)
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    if state is not None:
        total = state.compression_stats()["total"]
        payload, dense = total["payload_bytes"] / steps, total["dense_bytes"] / steps
        wire, dense_wire = total["wire_bytes"] / steps, total["dense_wire_bytes"] / steps
    else:
        payload, dense = torch_hook_bytes(model.module, hook, size)
        wire, dense_wire = allreduce_wire_bytes(payload, size), allreduce_wire_bytes(dense, size)
    return {"hook": hook, "test_accuracy": accuracy, "train_seconds": seconds, "steps": steps,
            "step_ms": 1000 * seconds / steps, "bytes_per_step": payload, "dense_bytes_per_step": dense,
            "wire_bytes_per_step": wire, "dense_wire_bytes_per_step": dense_wire,
            "replica_spread": spread.item(),
            "params_crc32": f"{zlib.crc32(flat.cpu().numpy().tobytes()):08x}"}


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    data = training_data(args, int(os.environ.get("LOCAL_RANK", 0)))
    results = [train(args, hook, data) for hook in args.hook]
    if dist.get_rank() == 0:
        print(f"{args.data} MLP (hidden {args.hidden}), DDP over Gloo, {dist.get_world_size()} ranks, {args.epochs} "
              f"epochs, batch {args.batch_size} per rank, on {'CUDA' if args.cuda else 'the CPU'}")
        print(f"{'hook':<15} {'test acc':>8} {'ms/step':>8} {'bytes/step':>11} {'ratio':>7} {'wire ratio':>10} "
              f"{'spread':>7} {'params':>8}")
        for r in results:
            print(f"{r['hook']:<15} {100 * r['test_accuracy']:>7.2f}% {r['step_ms']:>8.2f} "
                  f"{r['bytes_per_step']:>11.0f} {r['dense_bytes_per_step'] / r['bytes_per_step']:>6.1f}x "
                  f"{r['dense_wire_bytes_per_step'] / r['wire_bytes_per_step']:>9.1f}x {r['replica_spread']:>7.2g} "
                  f"{r['params_crc32']:>8}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": dist.get_world_size(), "epochs": args.epochs, "results": results}, f, indent=1)
    dist.destroy_process_group()
    # With a DDP communication hook (torch's own as well as ours), Gloo can abort the process in the interpreter's
    # teardown, after the process group was destroyed ("terminate called without an active exception", about 1
    # launch in 5 to 25 here; pytorch/pytorch#190489): everything is written, so leave without that teardown.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
