"""Compression.powersgd against PyTorch DDP's powerSGD_hook (issue 29): step time and bytes per step of both at
ranks (matrix approximation ranks) 1, 2 and 4, on the 10.5M-parameter MLP of link_worker.py, on loopback shaped to
--mbit in a network namespace (created here and always removed), at 2 and 4 processes. Both compress from their
first timed step (ours: start_iter=0; the hook starts at its second iteration and its first three are not timed).
Each launch runs ours, the hook, then ours and the hook again, so that drift on a shared machine falls on both.
Writes JSON, a table (ours / hook per row) and a bar plot.

Needs root (ip netns). Where namespaces cannot be made it says why and exits 0 without numbers.
"""
import argparse
import os
import statistics
import sys

from common import OUT_DIR, bar_plot, horovodrun_json, machine, markdown_table, progress, write_outputs
from shaped_link import NamespaceUnavailable, shaped_namespace

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTS = {4: "localhost:2,127.0.0.1:2"}  # two "nodes" on one machine


def names(rank):
    """link_worker.py's names of ours and the hook at one matrix approximation rank (4: no suffix)."""
    suffix = "" if rank == 4 else f"-r{rank}"
    return f"hvdext-powersgd{suffix}", f"powersgd{suffix}"


def run(prefix, ranks, mbit, args):
    order = [name for r in args.rank for name in names(r)] * 2
    rows = horovodrun_json(prefix, ranks, os.path.join(HERE, "link_worker.py"),
                           ["--compression", ",".join(order), "--params-m", args.params_m, "--steps", args.steps],
                           args.timeout, hosts=HOSTS.get(ranks))
    merged = {}
    for row in rows:  # the two runs of each configuration: the mean of their medians
        merged.setdefault(row["compression"], []).append(row)
    out = []
    for name, runs in merged.items():
        row = dict(runs[0], step_seconds=statistics.fmean(r["step_seconds"] for r in runs),
                   step_seconds_runs=[r["step_seconds"] for r in runs], link_mbit=mbit)
        out.append(row)
    return out


def table(rows):
    lines = []
    for mbit, ranks, rank in sorted({(r["link_mbit"], r["ranks"], r["matrix_rank"]) for r in rows}):
        ours, hook = (next(r for r in rows if (r["link_mbit"], r["ranks"], r["compression"]) == (mbit, ranks, n))
                      for n in names(rank))
        lines.append([mbit, ranks, rank, f"{ours['step_seconds']:.3f}", f"{hook['step_seconds']:.3f}",
                      f"{ours['step_seconds'] / hook['step_seconds']:.2f}", f"{ours['payload_bytes'] / 1e3:.1f}",
                      f"{hook['payload_bytes'] / 1e3:.1f}", f"{ours['wire_bytes'] / 1e3:.1f}",
                      f"{hook['wire_bytes'] / 1e3:.1f}"])
    return markdown_table(["Mbit/s", "processes", "rank", "ours step s", "hook step s", "ours / hook",
                           "ours KB/step", "hook KB/step", "ours wire KB/rank", "hook wire KB/rank"], lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 processes, rank 1, a 2.6M-parameter model, 2 steps")
    parser.add_argument("--ranks", default="2,4", help="process counts")
    parser.add_argument("--rank", default="1,2,4", help="matrix approximation ranks")
    parser.add_argument("--mbit", default="100")
    parser.add_argument("--params-m", type=float, default=10.5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.rank, args.params_m, args.steps = "2", "1", 2.6, 2
    args.rank = [int(x) for x in args.rank.split(",")]
    rows = []
    try:
        for mbit in [int(x) for x in args.mbit.split(",")]:
            with shaped_namespace(mbit) as prefix:
                for ranks in progress([int(x) for x in args.ranks.split(",")], f"powersgd {mbit} Mbit/s"):
                    print(f"[powersgd] {ranks} processes, {mbit} Mbit/s", flush=True)
                    rows += run(prefix, ranks, mbit, args)
    except NamespaceUnavailable as exc:
        print(f"[powersgd] skipped: {exc}")
        return 0
    for row in rows:
        row["matrix_rank"] = next(r for r in args.rank if row["compression"] in names(r))
    md = ("Compression.powersgd (ours) against DDP's powerSGD_hook on the same MLP, loopback shaped by tbf in a "
          "network namespace (all ranks share the link). step s = the mean of two runs' medians; KB/step = P, Q "
          "and the tensors sent dense, per rank; wire KB = what each rank sends by the ring allreduce.\n\n"
          + table(rows))
    groups = {}
    for r in rows:
        groups.setdefault(f"{r['link_mbit']} Mbit/s, {r['ranks']} proc., rank {r['matrix_rank']}",
                          {})["ours" if r["compression"].startswith("hvdext") else "DDP hook"] = r["step_seconds"]
    bar_plot(os.path.join(OUT_DIR, "powersgd_step_seconds.png"), "PowerSGD step time: ours and DDP's hook "
             "(lower is better)", groups, "seconds per step")
    md += "\n\n![step time](powersgd_step_seconds.png)"
    path = write_outputs("powersgd", {"machine": machine(), "args": vars(args), "rows": rows}, md)
    print(md)
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
