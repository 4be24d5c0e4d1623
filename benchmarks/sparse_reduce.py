"""Sparse-reduce benchmark (issue 17): top-k's bytes per rank by allgather and by sparse_reduce (Ok-Topk's sparse
allreduce, horovod_ext/compressors/transports/sparse_reduce.py), and step time on a slow link.

- bytes: top-k 1% and 0.1% (delta-coded indices, fp16 values) on the link benchmark's 10.5M-parameter MLP, counted
  from real horovodrun runs at 2, 3 and 4 ranks (unshaped loopback, compression_stats()["last_step"]) and planned by
  sparse_reduce.planned_bytes (the estimate "auto" chooses by) from 2 to 1024 ranks.
- link: link_worker.py's step time at 4 ranks on loopback shaped to 100 Mbit/s (benchmarks/shaped_link.py; root):
  dense allreduce, PyTorch DDP's PowerSGD (rank 4), top-k 1% and 0.1% by allgather and by sparse_reduce. Where no
  namespace can be made it says why and reports the bytes.
"""
import argparse
import os
import sys

from common import OUT_DIR, bar_plot, horovodrun_json, line_plot, machine, markdown_table, write_outputs
from horovod_ext.compressors.transports.sparse_reduce import planned_bytes
from horovod_ext.compression.wire import allreduce_wire_bytes
from shaped_link import NamespaceUnavailable, shaped_namespace

HERE = os.path.dirname(os.path.abspath(__file__))
PLANNED_RANKS = (2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
RATIOS = {"1%": ("topk-allgather", "topk-sparse", 100), "0.1%": ("topk0.1-allgather", "topk0.1-sparse", 1000)}
LINK_CONFIGS = "none,powersgd,topk-allgather,topk-sparse,topk0.1-allgather,topk0.1-sparse"


def model_sizes(params_m):
    from link_worker import model_of

    model, _ = model_of(params_m)
    return [p.numel() for p in model.parameters()]


def counted_rows(ranks, params_m, timeout):
    configs = ",".join(c for pair in RATIOS.values() for c in pair[:2])
    rows = []
    for n in ranks:
        print(f"[sparse_reduce] counting bytes at {n} ranks", flush=True)
        rows += horovodrun_json([], n, os.path.join(HERE, "link_worker.py"),
                                ["--compression", configs, "--params-m", params_m, "--steps", 1], timeout)
    return rows


def planned_rows(sizes):
    return [{"ranks": n, "dense": allreduce_wire_bytes(4 * sum(sizes), n),
             **{ratio: planned_bytes(sizes, cf, n) for ratio, (_, _, cf) in RATIOS.items()}} for n in PLANNED_RANKS]


def link_rows(ranks, params_m, steps, timeout):
    with shaped_namespace(100) as prefix:
        print(f"[sparse_reduce] link: {ranks} ranks, 100 Mbit/s: {LINK_CONFIGS}", flush=True)
        return horovodrun_json(prefix, ranks, os.path.join(HERE, "link_worker.py"),
                               ["--compression", LINK_CONFIGS, "--params-m", params_m, "--steps", steps], timeout)


def report(sizes, counted, planned, link, link_note):
    by = {(r["ranks"], r["compression"]): r for r in counted}
    ranks = sorted({r["ranks"] for r in counted})
    md = [f"Bytes each rank sends per step, {sum(sizes) / 1e6:.1f}M-parameter MLP (fp32), top-k with delta-coded "
          f"indices and fp16 values. Counted: compression_stats() of one real step (unshaped loopback); planned: "
          f"sparse_reduce.planned_bytes, the estimate transport=\"auto\" chooses by.\n"]
    rows = []
    for n in ranks:
        plan = next(p for p in planned if p["ranks"] == n)
        for ratio, (gather, sparse, _) in RATIOS.items():
            g, s = by[(n, gather)]["wire_bytes"], by[(n, sparse)]["wire_bytes"]
            rows.append([n, ratio, f"{g / 1e3:.1f}", f"{plan[ratio]['allgather'] / 1e3:.1f}", f"{s / 1e3:.1f}",
                         f"{plan[ratio]['sparse_reduce'] / 1e3:.1f}", f"{g / s:.2f}x"])
    md.append(markdown_table(["ranks", "top-k", "allgather KB (counted)", "allgather KB (planned)",
                              "sparse_reduce KB (counted)", "sparse_reduce KB (planned)", "allgather / sparse"],
                             rows))
    md.append("\nPlanned from 2 to 1024 ranks (KB per rank per step; dense / it in brackets):\n")
    prow = []
    for p in planned:
        cells = [p["ranks"], f"{p['dense'] / 1e6:.1f} MB"]
        for ratio in RATIOS:
            for transport in ("allgather", "sparse_reduce"):
                b = p[ratio][transport]
                cells.append(f"{b / 1e3:.1f} ({p['dense'] / b:.0f}x)")
        prow.append(cells)
    md.append(markdown_table(["ranks", "dense allreduce"] + [f"{t} {r}" for r in RATIOS
                                                             for t in ("allgather", "sparse_reduce")], prow))
    at = {p["ranks"]: p for p in planned}
    for ratio in RATIOS:
        s2, s64 = at[2][ratio]["sparse_reduce"], at[64][ratio]["sparse_reduce"]
        md.append(f"\nsparse_reduce {ratio}: bytes per rank at 64 ranks / at 2 ranks = {s64 / s2:.2f}x "
                  f"(allgather: {at[64][ratio]['allgather'] / at[2][ratio]['allgather']:.1f}x).")
    if link:
        base = {r["compression"]: r for r in link}
        psgd = base.get("powersgd")
        lrows = [[r["compression"], r.get("transport", ""), f"{r['wire_bytes'] / 1e6:.3f}", f"{r['step_seconds']:.3f}",
                  f"{r['comm_seconds']:.3f}",
                  f"{psgd['step_seconds'] / r['step_seconds']:.2f}x" if psgd else "-"] for r in link]
        md.append(f"\n#### Step time, {link[0]['ranks']} ranks, loopback shaped to 100 Mbit/s\n")
        md.append(markdown_table(["compression", "transport", "wire MB/rank/step", "step s", "comm s",
                                  "PowerSGD step / this step"], lrows))
        bar_plot(os.path.join(OUT_DIR, "sparse_reduce_link.png"), "step time, 4 ranks, 100 Mbit/s",
                 {"4 ranks": {r["compression"]: r["step_seconds"] for r in link}}, "seconds per step")
    else:
        md.append(f"\nLink: {link_note}")
    line_plot(os.path.join(OUT_DIR, "sparse_reduce_bytes.png"), "top-k bytes per rank per step (planned)",
              [p["ranks"] for p in planned],
              {f"{t} {r}": [p[r][t] / 1e6 for p in planned] for r in RATIOS for t in ("allgather", "sparse_reduce")},
              "ranks", "MB per rank per step", logx=True, logy=True)
    return "\n".join(md)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 1M-parameter model, counted at 2 and 3 ranks, no link")
    parser.add_argument("--params-m", type=float, default=10.5)
    parser.add_argument("--link-steps", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=1500)
    args = parser.parse_args()
    params_m, count_at = (1.0, [2, 3]) if args.quick else (args.params_m, [2, 3, 4])
    sizes = model_sizes(params_m)
    counted = counted_rows(count_at, params_m, args.timeout)
    planned = planned_rows(sizes)
    link, note = [], "not run (--quick)"
    if not args.quick:
        try:
            link = link_rows(4, params_m, args.link_steps, args.timeout)
        except NamespaceUnavailable as exc:
            note = f"not run: {exc}"
            print(f"[sparse_reduce] link not run: {exc}")
    md = report(sizes, counted, planned, link, note)
    path = write_outputs("sparse_reduce", {"machine": machine(), "args": vars(args), "counted": counted,
                                           "planned": planned, "link": link}, md)
    print(md)
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
