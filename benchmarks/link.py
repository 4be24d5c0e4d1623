"""Link benchmark: step time, communication time and bytes per step of dense, fp16 and ternary on loopback shaped
to a given bandwidth in a network namespace (created here and always removed), at 2 and 4 ranks.

Needs root (ip netns). Where namespaces cannot be made it says why and exits 0 without numbers.
"""
import argparse
import os
import sys

from common import horovodrun_json, machine, markdown_table, write_outputs
from netns import NamespaceUnavailable, shaped_namespace

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
        out.append([r["link_mbit"], r["ranks"], r["compression"], f"{r['parameters'] / 1e6:.1f}M",
                    f"{r['payload_bytes'] / 1e6:.2f}", f"{r['wire_bytes'] / 1e6:.2f}", f"{r['step_seconds']:.3f}",
                    f"{r['comm_seconds']:.3f}", f"{dense['comm_seconds'] / max(r['comm_seconds'], 1e-9):.1f}x",
                    f"{dense['step_seconds'] / r['step_seconds']:.1f}x"])
    return markdown_table(["Mbit/s", "ranks", "compression", "params", "payload MB/step", "wire MB/step (per rank)",
                           "step s", "comm s", "comm vs dense", "step vs dense"], out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 ranks, 100 Mbit, a 2.6M-parameter model, 2 steps")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--mbit", default="100")
    parser.add_argument("--compression", default="none,fp16,ternary")
    parser.add_argument("--params-m", type=float, default=10.5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.mbit, args.params_m, args.steps = "2", "100", 2.6, 2
    rows = []
    try:
        for rate in [int(x) for x in args.mbit.split(",")]:
            with shaped_namespace(rate) as prefix:
                for ranks in [int(x) for x in args.ranks.split(",")]:
                    print(f"[link] {ranks} ranks, {rate} Mbit/s: {args.compression}", flush=True)
                    rows += run_config(prefix, ranks, rate, args)
    except NamespaceUnavailable as exc:
        print(f"[link] skipped: {exc}")
        return 0
    md = ("Step time and communication on loopback shaped by tbf in a network namespace (all ranks share the link). "
          "comm s = seconds blocked waiting for the step's collectives after backward (median of the steps). "
          "wire MB = bytes each rank sends by Horovod's ring algorithms.\n\n" + table(rows))
    path = write_outputs("link", {"machine": machine(), "args": vars(args), "rows": rows}, md)
    print(md)
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
