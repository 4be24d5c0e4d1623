"""Low-communication training on a shaped link: the transformer language model of lm.py with AdamW, trained by
data-parallel AdamW (dense, ternary, top-k 1%), PyTorch DDP's PowerSGD hook, LSGD, and DiLoCo (dense, ternary and
top-k pseudo-gradients with error feedback; at 10 Mbit/s also H = 10 and 100) at --ranks ranks (4: two "nodes" of
2, DiLoCo also with groups="node") on loopback shaped to --mbit (benchmarks/diloco_worker.py has the runs). The
per-step methods take --steps steps, DiLoCo's --diloco-steps (default 3 x --steps: its steps send nothing between
rounds, so the comparison that matters is at the same seconds, not the same steps); the report states both budgets,
and where a method never reaches the target, the seconds and steps it had ("not reached within N s (S steps)").
Bytes are rank 0's bytes on the wire, every collective of the method counted by wire.py's ring formulas (its
compression_stats()'s total; DiLoCo's start broadcast and, with groups, the averages inside a worker included),
with the payload (the bytes handed to Horovod) beside them. Reports, per method, the final test loss and
perplexity, the wire bytes against dense's wire bytes over the same steps, and the wire bytes and training
seconds until the test loss first reaches the target, dense's final test loss x 1.02; a table and plots of loss
against seconds and against wire bytes.

    python benchmarks/diloco.py --mbit 100 --steps 400 --diloco-steps 1200 --inner-steps 50
    python benchmarks/diloco.py --mbit 10        # adds the H sweep
    python benchmarks/diloco.py --ranks 4        # two nodes of 2; DiLoCo's workers also as groups="node"
    python benchmarks/diloco.py --model cnn      # the digits CNN (or the nplm) with SGD: dense against DiLoCo
    python benchmarks/diloco.py --streaming      # Streaming DiLoCo (P = 4, overlap) beside whole-model DiLoCo
    python benchmarks/diloco.py --leader         # outer="leader" against the average, 3 seeds
    python benchmarks/diloco.py --mbit 10 --methods dense,diloco-ternary --torchrun diloco-ternary   # and torchrun's
    python benchmarks/diloco.py --mbit 10 --methods dense         # a long run in two launches: dense first,
    python benchmarks/diloco.py --mbit 10 --dense-from benchmarks/out/diloco_10mbit.json \
        --methods ternary,topk,powersgd-hook,lsgd,diloco,diloco-ternary,diloco-topk    # then the rest

--streaming runs dense, "local" (AdamW alone, no collective: the compute-alone step), whole-model DiLoCo at H = 48
and Streaming DiLoCo at H = 48 with 4 fragments (one every 12 steps) and overlap 6, fp32 and ternary, and states
the issue's goals: the streaming step within 10% of compute alone, its final loss within 2% of whole-model
DiLoCo's, and its peak bytes per exchange cut 4-fold (dense's row, for the target, unless --methods leaves it out).
--leader runs DiLoCo with outer="leader" beside the average (H = 50; at 4 ranks with groups="node") from seeds 1, 2
and 3 (the model's initialization and the batches), and states the final loss of each, per seed and on average.

--model cnn / nplm trains benchmarks/gravac_models.py's model with SGD (momentum 0.9) for gravac.py's schedule
(tta_worker.py's runs): dense data-parallel SGD against DiLoCo around the same SGD (H = 50, dense and ternary
pseudo-gradients; ternary also at H = 10); the target is dense's final test accuracy less half a point.

At 4 ranks the whole loopback is shaped: a group's own allreduce crosses the slow link too (on real nodes it
would not), which counts against the "-node" rows.
"""
import argparse
import json
import os
import sys

from common import (OUT_DIR, fewer, horovodrun_json, machine, markdown_table, not_reached, shown, torchrun_json,
                    write_outputs)
from shaped_link import NamespaceUnavailable, shaped_namespace

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ["dense", "ternary", "topk", "powersgd-hook", "lsgd", "diloco", "diloco-ternary", "diloco-topk"]
H_SWEEP = ["diloco-ternary-h10", "diloco-ternary-h100"]  # at 10 Mbit/s, beside H = 50
GROUPED = ["diloco-node", "diloco-ternary-node"]  # at 4 ranks
HOSTS = {4: "localhost:2,127.0.0.1:2"}
STREAMING = ["dense", "local", "diloco-h48", "diloco-h48-p4-t6", "diloco-ternary-h48", "diloco-ternary-h48-p4-t6"]
LEADER = {2: ["diloco", "diloco-leader"], 4: ["diloco-node", "diloco-leader-node"]}
SEEDS = (1, 2, 3)
STEP_GOAL, LOSS_GOAL = 1.10, 1.02  # streaming's step over compute alone; its final loss over whole-model DiLoCo's


def default_methods(mbit, ranks):
    return METHODS + (H_SWEEP if mbit == 10 and ranks == 2 else []) + (GROUPED if ranks == 4 else [])
TARGET_MARGIN = 1.02  # the target: dense's final test loss plus 2%


def first_reaching(curve, target, key):
    return next((p[key] for p in curve if p["loss"] <= target), None)


def plots(results, path_prefix, mbit):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for r in results:
        axes[0].plot([p["seconds"] for p in r["curve"]], [p["loss"] for p in r["curve"]], marker="o",
                     label=shown(r["method"]))
        axes[1].plot([max(p["bytes"], 1) for p in r["curve"]], [p["loss"] for p in r["curve"]], marker="o",
                     label=shown(r["method"]))
    axes[0].set(title=f"test loss against training seconds, {mbit} Mbit/s", xlabel="seconds", ylabel="test loss")
    axes[1].set(title="test loss against bytes on the wire (rank 0)", xlabel="wire bytes", ylabel="test loss",
                xscale="log")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path_prefix + "_loss.png", dpi=100)


def output_name(mbit, ranks=2, streaming=False):
    """diloco (100 Mbit/s, 2 ranks), else diloco_<mbit>mbit[_<ranks>ranks] (--streaming: diloco_streaming_...): the
    JSON, table and plot's name in benchmarks/out."""
    prefix = "diloco_streaming" if streaming else "diloco"
    return (prefix if mbit == 100 else f"{prefix}_{mbit}mbit") + ("" if ranks == 2 else f"_{ranks}ranks")


DENSE_CONFIG = ("model", "ranks", "mbit", "steps", "batch", "layers", "eval_every")  # what dense's row depends on


def dense_row_from(path, args):
    """The dense row of an earlier run's JSON (--dense-from), for a run in two launches: the same dense training on
    the same link, so that a long run at 10 Mbit/s can run dense in one launch and the other methods in another.
    SystemExit naming the settings where the saved run's differ from this one's."""
    with open(path) as f:
        saved = json.load(f)
    differ = [f"--{key.replace('_', '-')} {saved['args'].get(key)!r} there, {getattr(args, key)!r} here"
              for key in DENSE_CONFIG if saved["args"].get(key) != getattr(args, key)]
    if differ:
        raise SystemExit(f"--dense-from {path}: a run of other settings ({'; '.join(differ)})")
    dense = next((r for r in saved["results"] if r["method"] == "dense"), None)
    if dense is None:
        raise SystemExit(f"--dense-from {path}: the run has no dense row")
    return dense


def budget_of(r):
    """The seconds and steps a run had (evaluation excluded)."""
    return r.get("train_seconds", r["curve"][-1]["seconds"]), r.get("steps", r["curve"][-1]["step"])


def report(results, args):
    name = output_name(args.mbit, getattr(args, "ranks", 2), getattr(args, "streaming", False))
    dense = next((r for r in results if r["method"] == "dense"), None)
    target = dense["curve"][-1]["loss"] * TARGET_MARGIN if dense else -1.0  # no dense row: no target
    dense_wire = first_reaching(dense["curve"], target, "bytes") if dense else None
    rows = []
    for r in results:
        final = r["curve"][-1]["loss"]
        seconds, wire = first_reaching(r["curve"], target, "seconds"), first_reaching(r["curve"], target, "bytes")
        payload = first_reaching(r["curve"], target, "payload_bytes") if "payload_bytes" in r["curve"][0] else None
        missed = not_reached(*budget_of(r))
        peak = r.get("peak_exchange_bytes")
        rows.append([shown(r["method"]), r["inner_steps"] or "-", f"{final:.3f}", f"{2.718281828 ** final:.1f}",
                     f"{r['wire_bytes'] / 1e6:.2f}", fewer(r["dense_wire_bytes"], r["wire_bytes"]),
                     f"{r['payload_bytes'] / 1e6:.2f}",
                     f"{wire / 1e6:.3f}" if wire is not None else missed, fewer(dense_wire, wire),
                     f"{payload / 1e6:.3f}" if payload is not None else "-",
                     f"{seconds:.1f}" if seconds is not None else missed, f"{step_seconds(r) * 1e3:.1f}",
                     f"{peak / 1e6:.3f}" if peak else "-"])
    per_step = sorted({budget_of(r)[1] for r in results if not r["inner_steps"]})
    diloco = sorted({budget_of(r)[1] for r in results if r["inner_steps"]})
    md = (f"Transformer LM ({results[0]['parameters'] / 1e6:.2f}M parameters, lm.py), AdamW, batch {args.batch} per "
          f"rank, {results[0]['ranks']} ranks, loopback shaped to {args.mbit} Mbit/s. Budgets: "
          + "; ".join(part for part in (f"per-step methods {'/'.join(map(str, per_step))} steps" if per_step else "",
                                        f"DiLoCo {'/'.join(map(str, diloco))} steps" if diloco else "") if part)
          + " (each row's seconds: its training time). "
          + (f"Target: dense's final test loss x {TARGET_MARGIN} = {dense['curve'][-1]['loss']:.3f} x "
             f"{TARGET_MARGIN} = {target:.3f}, checked every {args.eval_every} steps. Wire bytes: rank 0's, every "
             f"collective by the ring formulas of horovod_ext/compression/wire.py; payload: the bytes it handed to "
             f"Horovod. 'x fewer' against dense's wire bytes (the whole run: data-parallel SGD's dense allreduce over "
             f"the row's own steps; to the target: the dense row's).\n\n"
             if dense else "No dense row, no target.\n\n")
          + markdown_table(["method", "H", "final test loss", "perplexity", "wire MB sent",
                            "x fewer wire bytes than dense", "payload MB sent", "wire MB to target",
                            "x fewer wire bytes to target", "payload MB to target", "s to target", "ms per step",
                            "peak payload MB per exchange"], rows)
          + streaming_goals(results) + f"\n\n![loss]({name}_loss.png)")
    path = write_outputs(name, {"machine": machine(), "args": vars(args), "results": results}, md)
    plots(results, os.path.join(OUT_DIR, name), args.mbit)
    print(md)
    print(f"\nwritten: {path}")
    return 0


def report_leader(by_seed, args):
    """--leader: the final test loss of outer="leader" and of the average, per seed and on average."""
    name = f"diloco_leader_{args.mbit}mbit_{args.ranks}ranks"
    average, leader = LEADER[args.ranks]
    rows, differences = [], []
    for seed, results in by_seed.items():
        final = {r["method"]: r["curve"][-1]["loss"] for r in results}
        differences.append(final[leader] - final[average])
        rows.append([seed, f"{final[average]:.3f}", f"{final[leader]:.3f}", f"{differences[-1]:+.3f}",
                     f"{final[leader] / final[average]:.3f}x"])
    mean = sum(differences) / len(differences)
    md = (f"Transformer LM, AdamW inner steps, DiLoCo H = {args.inner_steps}, {args.diloco_steps} steps, "
          f"{args.ranks} ranks{' (groups=node: two workers of 2)' if args.ranks == 4 else ''}, loopback shaped to "
          f"{args.mbit} Mbit/s; outer=\"leader\" (the worker with the lowest training loss since the last round "
          f"sends its pseudo-gradient) against the average, seeds {', '.join(map(str, by_seed))}.\n\n"
          + markdown_table(["seed", f"final loss, {average}", f"final loss, {leader}", "leader - average",
                            "leader / average"], rows)
          + f"\n\nMean difference (leader - average): {mean:+.3f}; the leader ended lower in "
            f"{sum(d < 0 for d in differences)} of {len(differences)} seeds.")
    path = write_outputs(name, {"machine": machine(), "args": vars(args),
                                "results": {str(k): v for k, v in by_seed.items()}}, md)
    print(md)
    print(f"\nwritten: {path}")
    return 0


def step_seconds(r):
    """Training seconds per step (evaluation excluded)."""
    return r.get("train_seconds", r["curve"][-1]["seconds"]) / r.get("steps", r["curve"][-1]["step"])


def whole_model_of(method):
    """The whole-model DiLoCo method a streaming one is compared with: its name without -p, -t and -a."""
    return "-".join(p for p in method.split("-") if not (p[:1] in "pta" and p[1:].replace(".", "").isdigit()))


def streaming_goals(results):
    """The streaming rows against the goals: the step over compute alone (local), the final loss over whole-model
    DiLoCo's with the same compression and H, and the peak bytes of one exchange over whole-model DiLoCo's."""
    by = {r["method"]: r for r in results}
    lines = []
    for r in results:
        if r["method"] == whole_model_of(r["method"]) or whole_model_of(r["method"]) not in by:
            continue
        whole = by[whole_model_of(r["method"])]
        fragments = next(int(p[1:]) for p in r["method"].split("-") if p[:1] == "p" and p[1:].isdigit())
        loss = r["curve"][-1]["loss"] / whole["curve"][-1]["loss"]
        parts = [f"final loss {loss:.3f}x whole-model {whole['method']}'s (goal <= {LOSS_GOAL}: "
                 f"{'met' if loss <= LOSS_GOAL else 'not met'})"]
        if r.get("peak_exchange_bytes") and whole.get("peak_exchange_bytes"):
            cut = whole["peak_exchange_bytes"] / r["peak_exchange_bytes"]
            parts.append(f"peak bytes per exchange cut {cut:.2f}-fold (P = {fragments})")
        if "local" in by:
            step = step_seconds(r) / step_seconds(by["local"])
            parts.append(f"step {step:.3f}x compute alone (goal <= {STEP_GOAL}: "
                         f"{'met' if step <= STEP_GOAL else 'not met'}; whole-model: "
                         f"{step_seconds(whole) / step_seconds(by['local']):.3f}x)")
        lines.append(f"- {r['method']}: " + "; ".join(parts))
    return ("\n\nStreaming DiLoCo against the goals (one run):\n" + "\n".join(lines)) if lines else ""


MODEL_METHODS = ["dense", "diloco", "diloco-ternary", "diloco-ternary-h10"]
ACCURACY_MARGIN = 0.005  # the target on the accuracy models: dense's final accuracy less half a point


def first_at_least(curve, target, key):
    return next((p[key] for p in curve if p["accuracy"] >= target - 1e-9), None)


def report_accuracy(results, args):
    """The accuracy models' table: wire bytes and seconds to dense's final accuracy less half a point."""
    name = f"diloco_{args.model}_{args.mbit}mbit"
    dense = next(r for r in results if r["method"] == "dense")
    final = dense["curve"][-1]["accuracy"]
    target = final - ACCURACY_MARGIN
    dense_wire = first_at_least(dense["curve"], target, "bytes")
    rows = []
    for r in results:
        total, end = r["curve"][-1]["bytes"], r["curve"][-1]
        seconds, wire = first_at_least(r["curve"], target, "seconds"), first_at_least(r["curve"], target, "bytes")
        missed = not_reached(end["seconds"], end["step"])
        rows.append([r["method"], f"{end['accuracy']:.2%}", f"{total / 1e6:.2f}",
                     fewer(dense["curve"][-1]["bytes"], total), f"{end.get('payload_bytes', 0) / 1e6:.2f}",
                     f"{wire / 1e6:.3f}" if wire is not None else missed, fewer(dense_wire, wire),
                     f"{seconds:.1f}" if seconds is not None else missed, f"{end['seconds']:.1f}"])
    md = (f"{args.model} ({results[0]['parameters'] / 1e6:.2f}M parameters, gravac_models.py), SGD momentum 0.9, "
          f"{results[0]['ranks']} ranks, loopback shaped to {args.mbit} Mbit/s, seed 42; every method the same "
          f"steps. Target: dense's final test accuracy - {ACCURACY_MARGIN} = {final:.2%} - {100 * ACCURACY_MARGIN:.1f} "
          f"points = {target:.2%}. Wire bytes: rank 0's, every collective by horovod_ext/compression/wire.py's ring "
          f"formulas; 'x fewer' against the dense row's wire bytes.\n\n"
          + markdown_table(["method", "final accuracy", "wire MB sent", "x fewer wire bytes than dense",
                            "payload MB sent", "wire MB to target", "x fewer wire bytes to target", "s to target",
                            "s in all"], rows))
    path = write_outputs(name, {"machine": machine(), "args": vars(args), "results": results}, md)
    print(md)
    print(f"\nwritten: {path}")
    return 0


def accuracy_model(args):
    """--model cnn / nplm: tta_worker.py's runs of MODEL_METHODS (or --methods) in one launch."""
    from gravac import TRAINING

    methods = args.methods or ",".join(MODEL_METHODS)
    if "dense" not in methods.split(","):
        raise SystemExit("--methods must include dense (the target is dense's final accuracy)")
    try:
        with shaped_namespace(args.mbit) as prefix:
            print(f"[diloco] {args.model}, {args.ranks} ranks, {args.mbit} Mbit/s: {methods}", flush=True)
            results = horovodrun_json(prefix, args.ranks, os.path.join(HERE, "tta_worker.py"),
                                      ["--method", methods, "--model", args.model, "--seed", 42,
                                       *TRAINING[args.model]], args.timeout, hosts=HOSTS.get(args.ranks))
    except NamespaceUnavailable as exc:
        print(f"[diloco] skipped: {exc}")
        return 0
    return report_accuracy(results, args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streaming", action="store_true", help="Streaming DiLoCo's rows (STREAMING) only")
    parser.add_argument("--leader", action="store_true", help="outer='leader' against the average (LEADER), "
                                                               "seeds 1, 2, 3")
    parser.add_argument("--quick", action="store_true", help="40 steps of dense, DiLoCo and DiLoCo with ternary "
                                                             "pseudo-gradients (H = 10), 1-layer model")
    parser.add_argument("--mbit", type=int, default=100)
    parser.add_argument("--ranks", type=int, choices=(2, 4), default=2)
    parser.add_argument("--model", choices=("lm", "cnn", "nplm"), default="lm")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--diloco-steps", type=int, default=None, help="DiLoCo's steps (default 3 x --steps)")
    parser.add_argument("--inner-steps", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--methods", default=None, help="comma-separated (default: every method of the link and "
                                                         "ranks, see METHODS, H_SWEEP, GROUPED); any DiLoCo "
                                                         "variant diloco_methods.py names, e.g. diloco-lr1-m0")
    parser.add_argument("--torchrun", default="", metavar="METHODS",
                        help="comma-separated DiLoCo methods to run again under torchrun (horovod_ext.ddp, no "
                             "Horovod), as rows named 'METHOD (torchrun)', beside the Horovod path's")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--report", metavar="JSON", help="only write the table and plots again from a run's JSON")
    parser.add_argument("--dense-from", metavar="JSON", help="take the dense row (and so the target) from an earlier "
                                                             "run's JSON of the same settings instead of running it")
    args = parser.parse_args()
    if args.model != "lm":
        return accuracy_model(args)
    if args.quick:
        args.steps, args.diloco_steps, args.inner_steps, args.eval_every, args.layers = 40, 40, 10, 10, 1
        args.methods = "dense,diloco,diloco-ternary"
    if args.streaming and not args.methods:
        args.methods = ",".join(STREAMING)
    if args.leader:
        args.methods = ",".join(LEADER[args.ranks])
    args.methods = args.methods or ",".join(default_methods(args.mbit, args.ranks))
    args.diloco_steps = args.diloco_steps or 3 * args.steps
    if "dense" not in args.methods.split(",") and not (args.streaming or args.leader or args.dense_from):
        parser.error("--methods must include dense (the target is dense's final loss), or --dense-from name a run "
                     "that has it")
    not_diloco = [m for m in args.torchrun.split(",") if m and not m.startswith("diloco")]
    if not_diloco:
        parser.error(f"--torchrun takes DiLoCo methods (diloco[-ternary|-topk]...), got {not_diloco}")
    if args.dense_from and "dense" in args.methods.split(","):
        parser.error("--dense-from takes dense's row from another run: leave dense out of --methods")
    earlier_dense = [dense_row_from(args.dense_from, args)] if args.dense_from else []
    if args.report:
        with open(args.report) as f:
            saved = json.load(f)
        return report(saved["results"], argparse.Namespace(**saved["args"]))
    worker = os.path.join(HERE, "diloco_worker.py")
    options = ["--inner-steps", args.inner_steps, "--eval-every", args.eval_every, "--batch", args.batch,
               "--layers", args.layers]
    methods = args.methods.split(",")
    dense_methods = [m for m in methods if not m.startswith("diloco")]  # with "local": the same steps
    diloco_methods = [m for m in methods if m.startswith("diloco")]
    # one launch per number of steps (--quick: one launch in all)
    groups = [(dense_methods + diloco_methods, args.steps)] if args.steps == args.diloco_steps else \
        [(dense_methods, args.steps), (diloco_methods, args.diloco_steps)]
    by_seed = {}
    try:
        with shaped_namespace(args.mbit) as prefix:
            for seed in (SEEDS if args.leader else (1,)):
                results = by_seed.setdefault(seed, [])
                for group, steps in groups:
                    if group:
                        print(f"[diloco] {args.ranks} ranks, {args.mbit} Mbit/s, {steps} steps, seed {seed}: "
                              f"{','.join(group)}", flush=True)
                        results += horovodrun_json(prefix, args.ranks, worker,
                                                   options + ["--method", ",".join(group), "--steps", steps,
                                                              "--seed", seed],
                                                   args.timeout, hosts=HOSTS.get(args.ranks))
                if args.torchrun:
                    print(f"[diloco] torchrun, {args.diloco_steps} steps: {args.torchrun}", flush=True)
                    rows = torchrun_json(prefix, args.ranks, worker,
                                         options + ["--method", args.torchrun, "--steps", args.diloco_steps,
                                                    "--seed", seed, "--adapter", "ddp"], args.timeout)
                    results += [dict(r, method=f"{r['method']} (torchrun)") for r in rows]
    except NamespaceUnavailable as exc:
        print(f"[diloco] skipped: {exc}")
        return 0
    return report_leader(by_seed, args) if args.leader else report(earlier_dense + by_seed[1], args)


if __name__ == "__main__":
    sys.exit(main())
