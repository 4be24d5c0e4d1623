"""Runs under horovodrun: the mean seconds of a 4-byte allreduce (after a warm-up), from which
perfmodel_validation.py takes the link's per-message latency alpha = t / (2 (N-1)), a measured input of the model."""
import argparse
import json
import time

import torch

import horovod_ext.torch as hvd


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    hvd.init()
    x = torch.zeros(1)
    for i in range(20):
        hvd.allreduce(x, name="warm")
    start = time.perf_counter()
    for i in range(args.repeats):
        hvd.allreduce(x, name="probe")
    seconds = (time.perf_counter() - start) / args.repeats
    if hvd.rank() == 0:
        with open(args.json, "w") as f:
            json.dump({"ranks": hvd.size(), "allreduce_4_bytes_seconds": seconds,
                       "alpha": seconds / (2 * (hvd.size() - 1))}, f)


if __name__ == "__main__":
    main()
