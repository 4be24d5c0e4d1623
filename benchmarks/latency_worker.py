"""Runs under horovodrun: the mean seconds of a 4-byte allreduce (after a warm-up), from which
benchmarks/perfmodel.py takes the link's per-message latency alpha = t / (2 (N-1)), and of a 4 MB allreduce, from
which it takes the bandwidth the ranks get together on the one shared loopback: N * 2 (N-1)/N * b / (t - t_4), in
Gbit/s. Both are measured inputs of the model, never fitted to the step times it predicts."""
import argparse
import json
import time

import torch

import horovod_ext.torch as hvd


def allreduce_seconds(x, name, warmups, repeats):
    """The mean seconds of an allreduce of x, after `warmups` untimed ones."""
    for _ in range(warmups):
        hvd.allreduce(x, name=f"warm.{name}")
    start = time.perf_counter()
    for _ in range(repeats):
        hvd.allreduce(x, name=name)
    return (time.perf_counter() - start) / repeats


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--large-repeats", type=int, default=3)
    args = parser.parse_args()
    hvd.init()
    n, large = hvd.size(), torch.zeros(2 ** 20)  # 4 MB
    seconds = allreduce_seconds(torch.zeros(1), "probe", 20, args.repeats)
    large_seconds = allreduce_seconds(large, "probe.large", 1, args.large_repeats)
    shared_wire = n * 2 * (n - 1) / n * large.numel() * 4  # every rank's ring bytes, on the one medium
    if hvd.rank() == 0:
        with open(args.json, "w") as f:
            json.dump({"ranks": n, "allreduce_4_bytes_seconds": seconds, "alpha": seconds / (2 * (n - 1)),
                       "allreduce_4_mb_seconds": large_seconds,
                       "gbit": 8 * shared_wire / max(large_seconds - seconds, 1e-9) / 1e9}, f)


if __name__ == "__main__":
    main()
