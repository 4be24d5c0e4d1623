"""GraVAC's headline, time to accuracy against static compression (issue 14): for three models of different shape
(benchmarks/gravac_models.py: the digits MLP, a small CNN, an LSTM language model), at 2 and 4 ranks on loopback
shaped to --mbit (a namespace created here and always removed), dense, static top-k 10x / 100x / 1000x, adaptive
top-k at its defaults, Compression.powersgd ("hvdext-powersgd") and PyTorch DDP's PowerSGD hook ("powersgd"), both
at rank 4, train the same epochs. Reports the wall-clock seconds until each first reaches dense's final test
accuracy (checked after each epoch), GraVAC's mean CF, share of dense steps and settled CF; plots accuracy against wall-clock time and GraVAC's CF over training."""
import argparse
import itertools
import os
import sys

from common import OUT_DIR, horovodrun_json, line_plot, machine, markdown_table, progress, write_outputs
from horovod_ext.shaped_link import NamespaceUnavailable, shaped_namespace

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ["mlp", "cnn", "lstm"]
METHODS = ["dense", "topk-10x", "topk-100x", "topk-1000x", "adaptive_topk", "hvdext-powersgd", "powersgd"]
HOSTS = {4: "localhost:2,127.0.0.1:2"}


def run(prefix, ranks, model, method, args):
    return horovodrun_json(prefix, ranks, os.path.join(HERE, "tta_worker.py"),
                           ["--method", method, "--model", model, "--epochs", args.epochs, "--hidden", args.hidden],
                           args.timeout, hosts=HOSTS.get(ranks))


def time_to(curve, target):
    return next((p["seconds"] for p in curve if p["accuracy"] >= target - 1e-9), None)


def rows_of(results):
    rows = []
    for r in results:
        dense = next(x for x in results if (x["model"], x["ranks"], x["method"]) == (r["model"], r["ranks"], "dense"))
        target, reached = dense["curve"][-1]["accuracy"], time_to(r["curve"], dense["curve"][-1]["accuracy"])
        dense_time = time_to(dense["curve"], target)
        cfs = r.get("cf_log") or []
        rows.append([r["model"], r["ranks"], r["method"], f"{100 * r['curve'][-1]['accuracy']:.2f}%",
                     f"{reached:.1f}" if reached is not None else "not reached",
                     f"{dense_time / reached:.2f}x" if reached else "-",
                     f"{r['step_seconds'] * 1e3:.0f}", f"{r['payload_bytes'] / 1e3:.1f}",
                     f"{sum(cfs) / len(cfs):.1f}" if cfs else "-",
                     f"{100 * sum(c == 1 for c in cfs) / len(cfs):.0f}%" if cfs else "-",
                     r.get("theta_ideal") if cfs and r.get("theta_ideal") is not None else "-"])
    return rows


def plots(results):
    groups = sorted({(r["model"], r["ranks"]) for r in results})
    for model, ranks in groups:
        runs = [r for r in results if (r["model"], r["ranks"]) == (model, ranks)]
        line_plot(os.path.join(OUT_DIR, f"gravac_{model}_{ranks}_accuracy.png"),
                  f"{model}, {ranks} ranks: test accuracy against wall-clock time",
                  None, {r["method"]: ([p["seconds"] for p in r["curve"]], [p["accuracy"] for p in r["curve"]])
                         for r in runs}, "training seconds", "test accuracy")
    adaptive = [r for r in results if r.get("cf_log")]
    line_plot(os.path.join(OUT_DIR, "gravac_cf.png"), "GraVAC's CF over training (defaults)", None,
              {f"{r['model']}, {r['ranks']} ranks": (list(range(len(r["cf_log"]))), r["cf_log"]) for r in adaptive},
              "step", "CF sent (1 = dense)", logy=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the CNN at 2 ranks, 2 epochs, dense and adaptive")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--mbit", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=1024, help="the MLP's width (0.6M parameters)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    if args.quick:
        args.models, args.ranks, args.epochs, args.methods = "cnn", "2", 2, "dense,adaptive_topk"
    results = []
    try:
        with shaped_namespace(args.mbit) as prefix:
            runs = list(itertools.product(args.models.split(","), [int(x) for x in args.ranks.split(",")],
                                          args.methods.split(",")))
            for model, ranks, method in progress(runs, f"GraVAC time to accuracy, {args.mbit} Mbit/s"):
                print(f"[gravac] {model}, {ranks} ranks, {args.mbit} Mbit/s: {method}", flush=True)
                results.append(run(prefix, ranks, model, method, args))
    except NamespaceUnavailable as exc:
        print(f"[gravac] skipped: {exc}")
        return 0
    md = (f"{args.epochs} epochs, batch 32 per rank, loopback shaped to {args.mbit} Mbit/s. 'to dense acc' = "
          f"wall-clock training seconds until the method first reaches dense's final test accuracy (checked after "
          f"each epoch); 'speed-up' = dense's time to that accuracy over the method's.\n\n"
          + markdown_table(["model", "ranks", "method", "final acc", "s to dense acc", "speed-up", "mean step ms",
                            "KB sent/step", "mean CF (GraVAC)", "dense steps", "settled CF"], rows_of(results))
          + "\n\n![CF](gravac_cf.png)")
    path = write_outputs("gravac", {"machine": machine(), "args": vars(args), "results": results}, md)
    plots(results)
    print(md)
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
