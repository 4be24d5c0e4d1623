"""Compression.auto's grid: its step time (once its choice has settled) over the best static method's, per model,
link and number of ranks, beside every static method at its defaults and DDP's PowerSGD hook; the goals checked.

    python benchmarks/auto.py                                 # 3 models x 4 links x 2 and 4 ranks
    python benchmarks/auto.py --models cnn --mbit 0,100 --ranks 2
    python benchmarks/auto.py --tta                           # time to the target: 2 models x 100, 10 Mbit/s
    python benchmarks/auto.py --quick                         # the CNN on loopback, 2 ranks, a few steps (tests)

Links: 0 is plain loopback, others loopback shaped by tbf in a network namespace (benchmarks/shaped_link.py; needs
root, else the shaped cells are skipped with the reason). Writes JSON, a table and a heat map to benchmarks/results.
--tta: each method's training time until it first reaches the target, dense's final test accuracy less half a point
(benchmarks/tta_worker.py, which knows "auto"; the models' training as benchmarks/gravac.py's), at 2 ranks.
"""
import argparse
import contextlib
import os
import sys

from common import OUT_DIR, horovodrun_json, machine, markdown_table, write_outputs
from shaped_link import NamespaceUnavailable, shaped_namespace

HERE = os.path.dirname(os.path.abspath(__file__))
STATIC = ("none", "fp16", "ternary", "topk-1%", "topk-10%", "adaptive_topk", "powersgd-r4")
HOSTS = {2: "localhost:2", 4: "localhost:2,127.0.0.1:2"}
TTA_METHODS = ("auto", "dense", "fp16", "ternary", "topk-10x", "topk-100x", "adaptive_topk", "hvdext-powersgd",
               "powersgd")  # tta_worker's names: top-k 10% and 1%; "powersgd" is DDP's hook
TOLERANCE = 0.005


def link_prefix(mbit):
    return contextlib.nullcontext([]) if mbit == 0 else shaped_namespace(mbit)


def cell_rows(prefix, model, ranks, mbit, args):
    methods = ",".join(["auto", *STATIC, "ddp-powersgd"])
    rows = horovodrun_json(prefix, ranks, os.path.join(HERE, "auto_worker.py"),
                           ["--model", model, "--methods", methods, "--steps", args.steps, "--settle", args.settle,
                            "--rounds", args.rounds, "--budget", args.budget], args.timeout, hosts=HOSTS[ranks])
    for row in rows:
        row["link_mbit"] = mbit
    return rows


def summary(rows):
    """One line per cell: auto over the best static method, over dense, over the DDP hook; the goals."""
    cells, out = {}, []
    for r in rows:
        cells.setdefault((r["model"], r["link_mbit"], r["ranks"]), {})[r["method"]] = r
    for (model, mbit, ranks), by in sorted(cells.items()):
        static = {m: by[m]["step_seconds"] for m in STATIC if m in by}
        best = min(static, key=static.get)
        auto = by["auto"]["step_seconds"]
        hook = by.get("ddp-powersgd", {}).get("step_seconds")
        chosen = sorted(set(by["auto"].get("choice", {}).values()))
        out.append({"model": model, "link_mbit": mbit, "ranks": ranks, "auto": auto, "best_static": best,
                    "best_static_seconds": static[best], "auto_over_best": auto / static[best],
                    "auto_over_dense": auto / static["none"], "auto_over_hook": auto / hook if hook else None,
                    "compression_pays": static[best] < static["none"] * 0.95, "chose": chosen})
    return out


def heat_map(summaries, path):
    from common import _pyplot
    plt = _pyplot()
    rows = sorted({(s["model"], s["ranks"]) for s in summaries})
    cols = sorted({s["link_mbit"] for s in summaries})
    grid = [[next((s["auto_over_best"] for s in summaries if (s["model"], s["ranks"]) == r and s["link_mbit"] == c),
                  float("nan")) for c in cols] for r in rows]
    fig, ax = plt.subplots(figsize=(1.6 * len(cols) + 2, 0.5 * len(rows) + 1.5))
    im = ax.imshow(grid, cmap="RdYlGn_r", vmin=0.8, vmax=1.3)
    ax.set_xticks(range(len(cols)), [("loopback" if c == 0 else f"{c} Mbit/s") for c in cols], rotation=25)
    ax.set_yticks(range(len(rows)), [f"{m}, {n} ranks" for m, n in rows])
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8)
    fig.colorbar(im, ax=ax, label="auto's step / best static method's")
    ax.set_title("Compression.auto over the best static method (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def tta(args):
    """Time to the target per model and link at 2 ranks (module docstring)."""
    from gravac import TRAINING, time_to
    rows, skipped = [], []
    for mbit in [int(x) for x in args.tta_mbit.split(",")]:
        try:
            with link_prefix(mbit) as prefix:
                for model in args.tta_models.split(","):
                    print(f"[auto] time to the target: {model}, {mbit or 'loopback'} Mbit/s", flush=True)
                    runs = horovodrun_json(prefix, 2, os.path.join(HERE, "tta_worker.py"),
                                           ["--method", ",".join(TTA_METHODS), "--model", model, "--seed", args.seed,
                                            "--hidden", args.hidden, *TRAINING[model]], args.timeout, hosts=HOSTS[2])
                    for run in runs:
                        run["link_mbit"] = mbit
                    rows += runs
        except NamespaceUnavailable as exc:
            skipped.append(f"{mbit} Mbit/s: {exc}")
    cells, table = [], []
    for model, mbit in sorted({(r["model"], r["link_mbit"]) for r in rows}):
        runs = {r["method"]: r for r in rows if (r["model"], r["link_mbit"]) == (model, mbit)}
        target = runs["dense"]["curve"][-1]["accuracy"] - TOLERANCE
        times = {m: time_to(r["curve"], target) for m, r in runs.items()}
        static = {m: t for m, t in times.items() if m not in ("auto", "powersgd") and t is not None}
        best = min(static, key=static.get) if static else None
        ratio = times["auto"] / static[best] if best and times["auto"] is not None else None
        cells.append({"model": model, "link_mbit": mbit, "target": target, "times": times, "best_static": best,
                      "auto_over_best": ratio, "final": {m: r["curve"][-1]["accuracy"] for m, r in runs.items()}})
        for m, r in runs.items():
            table.append([model, f"{mbit} Mbit/s", m, f"{r['curve'][-1]['accuracy']:.2%}",
                          "not reached" if times[m] is None else f"{times[m]:.1f}",
                          f"{r['block_step_seconds'] * 1e3:.1f}", f"{r.get('payload_bytes', 0) / 1e3:.1f}"])
    md = (f"Seed {args.seed}, 2 ranks, batch 32 per rank, digits MLP width {args.hidden}; "
          "target: dense's final test accuracy less half a point.\n\n"
          + markdown_table(["model", "link", "method", "final accuracy", "s to target", "step ms", "KB sent per step"],
                           table)
          + "\n\n" + "; ".join(f"{c['model']} at {c['link_mbit']} Mbit/s: auto / best static ({c['best_static']}) = "
                                + ("-" if c["auto_over_best"] is None else f"{c['auto_over_best']:.2f}")
                                for c in cells))
    goal = all(c["auto_over_best"] is not None and c["auto_over_best"] <= 1.1 for c in cells)
    md += ("\n\nGoal (auto's time to the target within 1.1x of the best static method's): "
           f"{'met' if goal else 'NOT met'}")
    if skipped:
        md += "\n\nSkipped: " + "; ".join(skipped)
    path = write_outputs("auto_tta", {"machine": machine(), "args": vars(args), "runs": rows, "cells": cells,
                                      "goal": goal}, md)
    print(md)
    print(f"\nwritten: {path}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp10m,cnn,nplm")
    parser.add_argument("--mbit", default="0,1000,100,10", help="0: plain loopback")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--steps", type=int, default=15, help="the most timed steps per method and cell")
    parser.add_argument("--budget", type=float, default=15.0,
                        help="seconds of timed steps per method (one step a round at least)")
    parser.add_argument("--settle", type=int, default=61, help="auto's untimed steps (its first three windows)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of timed steps (auto_worker.py)")
    parser.add_argument("--timeout", type=int, default=3600)
    parser.add_argument("--tta", action="store_true", help="time to the target instead of the step grid")
    parser.add_argument("--tta-models", default="mlp,cnn")
    parser.add_argument("--tta-mbit", default="100,10")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--hidden", type=int, default=256, help="the digits MLP's width (gravac_models.py)")
    parser.add_argument("--quick", action="store_true", help="the CNN on plain loopback at 2 ranks, a few steps")
    args = parser.parse_args()
    if args.quick:
        args.models, args.mbit, args.ranks = "cnn", "0", "2"
        args.steps, args.budget, args.settle, args.rounds = 2, 0.1, 3, 1
    if args.tta:
        return tta(args)
    rows, skipped = [], []
    for mbit in [int(x) for x in args.mbit.split(",")]:
        try:
            with link_prefix(mbit) as prefix:
                for model in args.models.split(","):
                    for ranks in [int(x) for x in args.ranks.split(",")]:
                        print(f"[auto] {model}, {mbit or 'loopback'} Mbit/s, {ranks} ranks", flush=True)
                        rows += cell_rows(prefix, model, ranks, mbit, args)
                        write_outputs("auto_rows", {"rows": rows}, "")  # what a failure later would lose
        except NamespaceUnavailable as exc:
            skipped.append(f"{mbit} Mbit/s: {exc}")
    cells = summary(rows)
    md = markdown_table(["model", "link", "ranks", "auto s", "best static", "its s", "auto / best", "auto / dense",
                         "auto / DDP hook", "auto chose"],
                        [[c["model"], "loopback" if c["link_mbit"] == 0 else f"{c['link_mbit']} Mbit/s", c["ranks"],
                          f"{c['auto']:.3f}", c["best_static"], f"{c['best_static_seconds']:.3f}",
                          f"{c['auto_over_best']:.2f}", f"{c['auto_over_dense']:.2f}",
                          "-" if c["auto_over_hook"] is None else f"{c['auto_over_hook']:.2f}", ", ".join(c["chose"])]
                         for c in cells])
    goals = {"within 1.1x of the best static method in every cell": all(c["auto_over_best"] <= 1.1 for c in cells),
             "within 1.05x of dense on loopback": all(c["auto_over_dense"] <= 1.05 for c in cells
                                                      if c["link_mbit"] == 0),
             "strictly first in at least two cells": sum(c["auto_over_best"] < 1.0 for c in cells) >= 2,
             "ahead of the DDP hook wherever compression pays": all(
                 c["auto_over_hook"] is None or c["auto_over_hook"] < 1.0 for c in cells if c["compression_pays"])}
    md += "\n\nGoals: " + "; ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in goals.items())
    if skipped:
        md += "\n\nSkipped: " + "; ".join(skipped)
    if cells:
        md += "\n\n![auto over best static](auto_heat_map.png)"
    path = write_outputs("auto", {"machine": machine(), "args": vars(args), "rows": rows, "cells": cells,
                                  "goals": goals}, md)
    if cells:
        heat_map(cells, os.path.join(OUT_DIR, "auto_heat_map.png"))
    print(md)
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
