"""Time to accuracy on a shaped link: every method trains the same digits MLP for the same epochs at 2 and 4 ranks
on loopback shaped to --mbit (a namespace created here and always removed), so every method has the same budget of
steps. Reports step time, bytes per step on the wire (rank 0's, every collective of the method by wire.py's ring
formulas; the payload beside them) against dense's, and the training time until each method first reaches dense's
final test accuracy and a fixed --target (or "not reached within N s", N its whole training time), as a table, a
plot of accuracy against training time and a plot of GraVAC's CF over training. Methods are compressors with
data-parallel SGD (Compression.powersgd is "hvdext-powersgd"), PyTorch DDP's PowerSGD hook ("powersgd"), and the
parameter-space optimizers lsgd, multi_lsgd (4 ranks run as two "nodes" of 2, so that its groups are two process
sets) and easgd, their asynchronous forms (async_lsgd, async_multi_lsgd, async_easgd: asynchronous=True at the
default staleness) and "compute" (each rank trains
alone, no collective in a step: the step time that communication cannot beat). LSGD's rows also give the
accuracy of the center variable (the workers' average), which the paper evaluates."""
import argparse
import json
import os
import sys

from common import OUT_DIR, horovodrun_json, machine, markdown_table, not_reached, progress, shown, write_outputs
from shaped_link import NamespaceUnavailable, shaped_namespace

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ["dense", "fp16", "ternary", "topk-10x", "topk-1000x", "adaptive_topk", "lsgd", "multi_lsgd", "easgd",
           "ddp-fp16", "hvdext-powersgd", "powersgd"]
HOSTS = {4: "localhost:2,127.0.0.1:2"}  # two "nodes" on one machine


def run(prefix, ranks, methods, args):
    """Every method's run at `ranks` ranks, in one launch (tta_worker.py trains them in turn)."""
    return horovodrun_json(prefix, ranks, os.path.join(HERE, "tta_worker.py"),
                           ["--method", ",".join(methods), "--epochs", args.epochs, "--hidden", args.hidden],
                           args.timeout * len(methods), hosts=HOSTS.get(ranks))


def time_to(curve, target, key="accuracy"):
    return next((p["seconds"] for p in curve if p.get(key, 0.0) >= target - 1e-9), None)


def plots(results, path_prefix):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks_list = sorted({r["ranks"] for r in results})
    fig, axes = plt.subplots(1, len(ranks_list), figsize=(6 * len(ranks_list), 4), squeeze=False)
    for ax, ranks in zip(axes[0], ranks_list):
        for r in (x for x in results if x["ranks"] == ranks):
            ax.plot([p["seconds"] for p in r["curve"]], [p["accuracy"] for p in r["curve"]], marker="o",
                    label=shown(r["method"]))
        ax.set(title=f"{ranks} ranks", xlabel="training seconds", ylabel="test accuracy", xscale="log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path_prefix + "_accuracy.png", dpi=100)
    if not any(r.get("cf_log") for r in results):
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in results:
        if r.get("cf_log"):
            ax.plot(r["cf_log"], label=f"{r['ranks']} ranks")
    ax.set(title="GraVAC compression factor over training", xlabel="step", ylabel="CF (elements)", yscale="log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path_prefix + "_cf.png", dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 ranks, 2 epochs, dense, ternary, adaptive top-k, "
                                                             "LSGD and PowerSGD")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--mbit", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--target", type=float, default=0.95, help="a fixed test accuracy to time every method to")
    parser.add_argument("--report", metavar="TTA_JSON", help="only write the table and plots again, from the "
                                                             "results of an earlier run (its tta.json)")
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.epochs, args.hidden = "2", 2, 256
        args.methods = "dense,ternary,adaptive_topk,lsgd,hvdext-powersgd,powersgd"
    if "dense" not in args.methods.split(","):
        parser.error("--methods must include dense (the reference every method is compared with)")
    if args.report:
        with open(args.report) as f:
            saved = json.load(f)
        args.epochs, args.mbit = saved["args"]["epochs"], saved["args"]["mbit"]
        return report(saved["results"], args)
    results = []
    os.makedirs(OUT_DIR, exist_ok=True)
    try:
        with shaped_namespace(args.mbit) as prefix:
            for ranks in progress([int(x) for x in args.ranks.split(",")], f"time to accuracy, {args.mbit} Mbit/s"):
                print(f"[tta] {ranks} ranks, {args.mbit} Mbit/s: {args.methods}", flush=True)
                results += run(prefix, ranks, args.methods.split(","), args)
                with open(os.path.join(OUT_DIR, "tta_partial.json"), "w") as f:  # kept should the report fail
                    json.dump(results, f)
    except NamespaceUnavailable as exc:
        print(f"[tta] skipped: {exc}")
        return 0
    return report(results, args)


def report(results, args):
    """The table, the JSON and the plots of `results` (one dict per run, as tta_worker.py writes them)."""
    rows = []
    compute = {x["ranks"]: x for x in results if x["method"] == "compute"}
    for r in results:
        dense = next(x for x in results if x["ranks"] == r["ranks"] and x["method"] == "dense")
        target = dense["curve"][-1]["accuracy"]
        reached = time_to(r["curve"], target)
        dense_reached = time_to(dense["curve"], target)
        cfs = r.get("cf_log") or []
        fixed = time_to(r["curve"], args.target)
        missed = not_reached(r["curve"][-1]["seconds"], r["curve"][-1].get("step"))
        rows.append([r["ranks"], shown(r["method"]), f"{r['step_seconds'] * 1e3:.0f}",
                     f"{dense['step_seconds'] / r['step_seconds']:.1f}x", f"{r['wire_bytes'] / 1e3:.1f}",
                     f"{r['dense_wire_bytes'] / r['wire_bytes']:.1f}x" if r["wire_bytes"] else "-",
                     f"{r['payload_bytes'] / 1e3:.1f}",
                     f"{100 * r['curve'][-1]['accuracy']:.2f}%",
                     f"{reached:.1f}" if reached is not None else missed,
                     f"{dense_reached / reached:.1f}x" if reached and dense_reached is not None else "-",
                     f"{fixed:.1f}" if fixed is not None else missed,
                     f"{sum(cfs) / len(cfs):.1f}" if cfs else "-"])
        if compute:
            alone = compute.get(r["ranks"])
            center = r["curve"][-1].get("center_accuracy")
            center_time = time_to(r["curve"], args.target, "center_accuracy") if center is not None else None
            rows[-1] += [f"{r['step_seconds'] / alone['step_seconds']:.2f}x" if alone else "-",
                         f"{100 * center:.2f}%" if center is not None else "-",
                         "-" if center is None else f"{center_time:.1f}" if center_time is not None else "not reached"]
    finals = {x["ranks"]: x["curve"][-1]["accuracy"] for x in results if x["method"] == "dense"}
    md = (f"Digits MLP ({results[0]['parameters'] / 1e6:.2f}M parameters), {args.epochs} epochs (every method the "
          f"same steps), batch 32 per rank, loopback shaped to {args.mbit} Mbit/s. 's to dense acc' = training "
          f"seconds until the method first reaches dense's final test accuracy at its number of ranks ("
          + ", ".join(f"{100 * a:.2f}% at {n} ranks" for n, a in sorted(finals.items()))
          + ", checked after each epoch); 'sooner than dense': dense's seconds to it over the method's. Wire bytes: "
            "rank 0's per step, every collective of the method by "
            "horovod_ext/compression/wire.py's ring formulas; 'wire vs dense': data-parallel SGD's dense allreduce's "
            "wire bytes over them; payload: the bytes handed to Horovod.\n\n"
          + markdown_table(["ranks", "method", "mean step ms", "step vs dense", "wire KB/step", "wire vs dense",
                            "payload KB/step", "final acc", "s to dense acc", "sooner than dense",
                            f"s to {100 * args.target:.0f}%",
                            "mean CF (GraVAC)"]
                          + (["step vs compute", "final acc (center)", f"s to {100 * args.target:.0f}% (center)"]
                             if compute else []),
                            rows)
          + "\n\n![accuracy](tta_accuracy.png)" + (" ![CF](tta_cf.png)" if any(r.get("cf_log") for r in results)
                                                   else ""))
    path = write_outputs("tta", {"machine": machine(), "args": vars(args), "results": results}, md)
    plots(results, os.path.join(OUT_DIR, "tta"))
    print(md)
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
