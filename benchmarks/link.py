"""Link benchmark: step time, communication time and bytes per step of Horovod dense and fp16, ternary, top-k and
adaptive top-k, and PyTorch DDP dense / fp16 hook / PowerSGD hook, on loopback shaped to 100 Mbit/s and 1 Gbit/s in
a network namespace (created here and always removed), at 2 and 4 ranks. Writes JSON, a table and a plot.

Needs root (ip netns). Where namespaces cannot be made it says why and exits 0 without numbers.
"""
import argparse
import os
import sys

from common import OUT_DIR, bar_plot, fewer, horovodrun_json, machine, markdown_table, progress, shown, write_outputs
from shaped_link import NamespaceUnavailable, shaped_namespace

HERE = os.path.dirname(os.path.abspath(__file__))


def run_config(prefix, ranks, rate, args):
    rows = horovodrun_json(prefix, ranks, os.path.join(HERE, "link_worker.py"),
                           ["--compression", args.compression, "--params-m", args.params_m, "--steps", args.steps],
                           args.timeout)
    for row in rows:
        row["link_mbit"] = rate
    return rows


def table(rows):
    out = []
    for r in rows:
        dense = next(x for x in rows if x["compression"] == "none" and x["ranks"] == r["ranks"]
                     and x["link_mbit"] == r["link_mbit"])
        out.append([r["link_mbit"], r["ranks"], shown(r["compression"]), f"{r['parameters'] / 1e6:.1f}M",
                    f"{r['wire_bytes'] / 1e6:.2f}", fewer(dense["wire_bytes"], r["wire_bytes"]),
                    f"{r['payload_bytes'] / 1e6:.2f}", f"{r['step_seconds']:.3f}",
                    f"{r['comm_seconds']:.3f}", f"{dense['comm_seconds'] / max(r['comm_seconds'], 1e-9):.1f}x",
                    f"{dense['step_seconds'] / r['step_seconds']:.1f}x"])
    return markdown_table(["Mbit/s", "ranks", "compression", "params", "wire MB/step (per rank)",
                           "x fewer wire bytes than dense", "payload MB/step", "step s", "comm s", "comm vs dense",
                           "step vs dense"], out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 ranks, 100 Mbit, a 2.6M-parameter model, 2 steps")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--mbit", default="100,1000")
    parser.add_argument("--compression", default="none,fp16,ternary,topk,adaptive_topk,ddp,ddp-fp16,powersgd")
    parser.add_argument("--params-m", type=float, default=10.5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.mbit, args.params_m, args.steps = "2", "100", 2.6, 2
        args.compression = "none,ternary,topk,ddp-fp16"
    rows = []
    rates, rank_counts = [int(x) for x in args.mbit.split(",")], [int(x) for x in args.ranks.split(",")]
    try:
        for rate in rates:
            with shaped_namespace(rate) as prefix:
                for ranks in progress(rank_counts, f"link {rate} Mbit/s"):
                    print(f"[link] {ranks} ranks, {rate} Mbit/s: {args.compression}", flush=True)
                    rows += run_config(prefix, ranks, rate, args)
    except NamespaceUnavailable as exc:
        print(f"[link] skipped: {exc}")
        return 0
    md = ("Step time and communication on loopback shaped by tbf in a network namespace (all ranks share the link). "
          "comm s = seconds blocked waiting for the step's collectives after backward (median of the steps). "
          "wire MB = rank 0's bytes on the wire per step, every collective of the step by the ring formulas of "
          "horovod_ext/compression/wire.py; 'x fewer' against the dense row's (Compression.none) wire bytes at the "
          "same link and ranks; payload MB = the bytes rank 0 handed to Horovod.\n\n" + table(rows))
    groups = {}
    for r in rows:
        group = groups.setdefault(f"{r['link_mbit']} Mbit/s, {r['ranks']} ranks", {})
        group[shown(r["compression"])] = r["step_seconds"]
    bar_plot(os.path.join(OUT_DIR, "link_step_seconds.png"), "step time on a shaped link (lower is better)", groups,
             "seconds per step", log=True)
    md += "\n\n![step time](link_step_seconds.png)"
    path = write_outputs("link", {"machine": machine(), "args": vars(args), "rows": rows}, md)
    print(md)
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
