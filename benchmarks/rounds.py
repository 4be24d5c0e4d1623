"""What each compressor asks of Horovod per step: collectives, dependent rounds and waits (rounds_worker.py counts
them where Horovod is called), on the main job's digits MLP (6 tensors), on 80 Linear(128, 128) layers (160
tensors) and on the same elements in 2 tensors (wide2), at 2 ranks on loopback, at each --bucket-cap-mb.
Collectives and rounds do not depend on timing, so a change that adds a round to the step shows here as a number,
not as a slower run on a noisy machine; the compression and step milliseconds do. Writes JSON and a table.

    python benchmarks/rounds.py [--ranks 2] [--steps 20] [--bucket-cap-mb 0,25]
"""
import argparse
import os

from common import horovodrun_json, machine, markdown_table, write_outputs

HERE = os.path.dirname(os.path.abspath(__file__))


def table(rows):
    """One row per model and compressor: per-step means of the counts (rounds_worker.py's module docstring)."""
    return markdown_table(
        ["model", "tensors", "compression", "bucket_cap_mb", "buckets", "collectives/step", "dependent rounds/step",
         "waits/step", "blocked waits/step", "compression ms/step", "median step ms"],
        [[r["model"], r["tensors"], r["compression"], f"{r['bucket_cap_mb']:g}", r["buckets"],
          f"{r['collectives_per_step']:.1f}", f"{r['rounds_per_step']:.1f}", f"{r['waits_per_step']:.1f}",
          f"{r['blocked_per_step']:.1f}", f"{r['compression_seconds_per_step'] * 1e3:.2f}",
          f"{r['step_seconds'] * 1e3:.1f}"]
         for r in rows])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--models", default="digits,deep80")
    parser.add_argument("--compression", default="none,fp16,ternary,ternary-shared,topk,adaptive_topk,powersgd")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--bucket-cap-mb", default="25", help="comma-separated caps (0: one collective per tensor)")
    parser.add_argument("--quick", action="store_true", help="the digits MLP, dense and ternary, 5 steps")
    args = parser.parse_args()
    if args.quick:
        args.models, args.compression, args.steps = "digits", "none,ternary", 5
    result = horovodrun_json([], args.ranks, os.path.join(HERE, "rounds_worker.py"),
                             ["--models", args.models, "--compression", args.compression, "--steps", args.steps,
                              "--bucket-cap-mb", args.bucket_cap_mb],
                             args.timeout)
    md = table(result["rows"])
    print(md)
    write_outputs("rounds", {"machine": machine(), "ranks": args.ranks, **result}, md)


if __name__ == "__main__":
    main()
