"""Data-parallel training of an MLP on scikit-learn's digits with horovod-ext, written like Horovod's examples.

    horovodrun -np 2 python examples/pytorch_digits.py --compression none,ternary
    horovodrun -np 4 -H localhost:2,127.0.0.1:2 python examples/pytorch_digits.py --optimizer dp,lsgd,multi_lsgd,easgd

Every rank trains on its shard of the training set; the script trains one model per listed compression (data-
parallel SGD, ``--optimizer dp``) and per listed parameter-space optimizer (LSGD, multi-leader LSGD, EASGD, and
their asynchronous forms async_lsgd, async_multi_lsgd, async_easgd), from
the same initial weights and data order, and rank 0 prints test accuracy and bytes sent per step beside each other.
The only horovod-ext-specific lines are the import and the optimizer: any Horovod script's ``compression=`` takes
the new compressors, and ``hvd.LeaderOptimizer`` / ``hvd.ElasticAveragingOptimizer`` replace
``hvd.DistributedOptimizer`` (they evaluate the leader's parameters, or the center).
"""
import argparse
import contextlib
import json
import time
import zlib

import torch
import torch.nn.functional as F

import horovod_ext.torch as hvd
from digits_data import add_training_arguments, make_model, training_data

COMPRESSIONS = {"none": lambda: hvd.Compression.none, "fp16": lambda: hvd.Compression.fp16,
                "ternary": lambda: hvd.Compression.ternary,
                "ternary-shared": lambda: hvd.Compression.ternary(shared_scale=True),
                "ternary-2bit": lambda: hvd.Compression.ternary(packing="2bit"),
                "topk": lambda: hvd.Compression.topk(ratio=0.1),  # sparse_reduce from 3 ranks on ("auto")
                "topk-allgather": lambda: hvd.Compression.topk(ratio=0.1, transport="allgather"),
                "topk-1%": lambda: hvd.Compression.topk(ratio=0.01),
                "topk-1%-allgather": lambda: hvd.Compression.topk(ratio=0.01, transport="allgather"),
                "topk-1000x": lambda: hvd.Compression.topk(ratio=0.001),
                "adaptive_topk": lambda: hvd.Compression.adaptive_topk(**ADAPTIVE),
                "powersgd": lambda: hvd.Compression.powersgd,
                "powersgd-rank1": lambda: hvd.Compression.powersgd(rank=1),
                "auto": lambda: hvd.Compression.auto}  # each tensor's method chosen online
ADAPTIVE = {}  # GraVAC at its defaults unless --adaptive says otherwise
# Parameter-space optimizers: each rank steps on its own gradient and is pulled every `period` steps.
OPTIMIZERS = {"dp": None,
              "lsgd": lambda opt, named: hvd.LeaderOptimizer(opt, named, groups=None),
              "multi_lsgd": lambda opt, named: hvd.LeaderOptimizer(opt, named, groups="node"),
              "easgd": lambda opt, named: hvd.ElasticAveragingOptimizer(opt, named),
              "async_lsgd": lambda opt, named: hvd.LeaderOptimizer(opt, named, groups=None, asynchronous=True),
              "async_multi_lsgd": lambda opt, named: hvd.LeaderOptimizer(opt, named, groups="node", asynchronous=True),
              "async_easgd": lambda opt, named: hvd.ElasticAveragingOptimizer(opt, named, asynchronous=True)}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compression", default="none,ternary",
                        help=f"comma-separated list of {', '.join(COMPRESSIONS)} (default: none,ternary)")
    parser.add_argument("--optimizer", default="dp",
                        help=f"comma-separated list of {', '.join(OPTIMIZERS)} (default: dp, data-parallel SGD "
                             f"with each --compression)")
    add_training_arguments(parser)
    parser.add_argument("--adaptive", default="", help="adaptive_topk arguments, e.g. epsilon=0.5,window=50")
    args = parser.parse_args()
    names = args.compression.split(",")
    unknown = [n for n in names if n not in COMPRESSIONS]
    if unknown:
        parser.error(f"--compression: unknown {unknown}; allowed values are {', '.join(COMPRESSIONS)}")
    args.compression = names
    args.optimizer = args.optimizer.split(",")
    unknown = [n for n in args.optimizer if n not in OPTIMIZERS]
    if unknown:
        parser.error(f"--optimizer: unknown {unknown}; allowed values are {', '.join(OPTIMIZERS)}")
    for item in filter(None, args.adaptive.split(",")):
        key, value = item.split("=")
        ADAPTIVE[key] = value if key == "policy" else float(value) if "." in value else int(value)
    return args


def train(args, optimizer_name, compression_name, data):
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(args.seed)
    model = make_model(args.hidden)
    if args.cuda:
        model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    if optimizer_name == "dp":
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=COMPRESSIONS[compression_name]())
    else:
        optimizer = OPTIMIZERS[optimizer_name](optimizer, model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    shard = torch.arange(hvd.rank(), len(x_train), hvd.size())
    gen = torch.Generator().manual_seed(args.seed + hvd.rank())
    start = time.perf_counter()
    factors = []  # adaptive_topk: (cf, path, gain_min, gain_c) of each step
    for epoch in range(args.epochs):
        if optimizer_name == "dp":
            order = shard[torch.randperm(len(shard), generator=gen)]
        else:  # LSGD, EASGD: every worker samples from the whole training set (as in both papers), same steps
            order = torch.randperm(len(x_train), generator=gen)[:len(shard)]
        for i in range(0, len(order) - args.batch_size + 1, args.batch_size):
            idx = order[i:i + args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            if optimizer_name != "dp":
                optimizer.report_loss(loss)  # the leader is the rank with the lowest running-average loss
            optimizer.step()
            if compression_name == "adaptive_topk" and optimizer_name == "dp":  # its log keeps the last window
                last = optimizer.compression_stats()
                factors.append((last["cf"], last["path"], round(last["gain_min"], 3), round(last["gain_c"], 3)))
    seconds = time.perf_counter() - start
    spread = replica_spread(model)
    checksum = parameters_crc32(model)
    evaluated = optimizer.evaluation_parameters() if optimizer_name != "dp" else contextlib.nullcontext()
    with torch.no_grad(), evaluated:  # LSGD: the best worker's parameters; EASGD: the center
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    stats = optimizer.compression_stats()
    steps = max(stats["steps"], 1)
    total = stats["total"]
    name = compression_name if optimizer_name == "dp" else optimizer_name
    return {"compression": name, "optimizer": optimizer_name, "test_accuracy": accuracy, "train_seconds": seconds,
            "steps": stats["steps"], "bytes_per_step": total["payload_bytes"] / steps,
            "dense_bytes_per_step": total["dense_bytes"] / steps,
            "wire_bytes_per_step": total["wire_bytes"] / steps,
            "dense_wire_bytes_per_step": total["dense_wire_bytes"] / steps,
            "bits_per_element": total["bits_per_element"], "comm_seconds": total["comm_seconds"],
            "replica_spread": spread, "params_crc32": checksum,
            "cf_log": [f[0] for f in factors], "paths": [f[1] for f in factors],
            "gains": [f[2:] for f in factors][::50],
            # GraVAC: the CF it settled on (None while exploring) and the table it settles from
            **({"gravac": {"theta_ideal": stats["theta_ideal"],
                           "throughput": [[cf, t, n] for cf, (t, n) in stats["throughput"].items()]}}
               if "throughput" in stats else {})}


def replica_spread(model):
    """max over ranks and parameters of |p - rank 0's p|: 0.0 where data-parallel replicas are identical (LSGD and
    EASGD workers differ between their pulls by design)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    root = hvd.broadcast(flat, root_rank=0, name="replica_spread.params")
    spread = (flat - root).abs().max().reshape(1)
    return hvd.allreduce(spread, op=hvd.Max, name="replica_spread.max").item()


def parameters_crc32(model):
    """CRC-32 of this rank's parameters' bytes: two runs of a seeded script end on the same model iff it is equal
    (the draws' key is the script's seed; README, "Same seed, same model")."""
    return f"{zlib.crc32(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy().tobytes()):08x}"


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    data = training_data(args, hvd.local_rank())
    runs = [(o, c) for o in args.optimizer for c in (args.compression if o == "dp" else [None])]
    results = [train(args, o, c, data) for o, c in runs]
    if hvd.rank() == 0:
        print(f"{args.data} MLP (hidden {args.hidden}), {hvd.size()} ranks, {args.epochs} epochs, "
              f"batch {args.batch_size} per rank, on {'CUDA' if args.cuda else 'the CPU'}")
        print(f"{'run':<15} {'test acc':>8} {'bytes/step':>11} {'dense bytes':>11} {'ratio':>6} "
              f"{'bits/elem':>9} {'wire ratio':>10} {'train s':>8} {'spread':>8} {'params':>8}")
        for r in results:
            ratio = r["dense_bytes_per_step"] / r["bytes_per_step"] if r["bytes_per_step"] else float("inf")
            wire = (r["dense_wire_bytes_per_step"] / r["wire_bytes_per_step"] if r["wire_bytes_per_step"]
                    else float("inf"))
            print(f"{r['compression']:<15} {100 * r['test_accuracy']:>7.2f}% {r['bytes_per_step']:>11.0f} "
                  f"{r['dense_bytes_per_step']:>11.0f} {ratio:>5.1f}x {r['bits_per_element']:>9.2f} "
                  f"{wire:>9.1f}x {r['train_seconds']:>8.2f} {r['replica_spread']:>8.2g} {r['params_crc32']:>8}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": hvd.size(), "epochs": args.epochs, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
