"""python -m horovod_ext.perfmodel --model resnet50|vgg16|bert-base|<shapes file>

Prints, for each link, the speed-up over dense (float32 allreduce) of every compressor and optimizer at 2 ... 1024
ranks, with the step time at the largest, and writes TernGrad-style plots (speed-up against ranks, one line per
method, one panel per link). Compute per step: --compute-seconds, else the model file's assumed value."""
import argparse
import os
import sys

from .catalog import NAMES, load
from .collectives import Cluster, Link
from .plans import METHODS, sizes_of, transport_of
from .predict import THROUGHPUT, compression_seconds_of, predict

RANKS = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def _numbers(text, kind):
    try:
        return [kind(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of numbers, got {text!r}") from None


def _measured(text):
    """METHOD=SECONDS[,METHOD=SECONDS...] -> {method: seconds}."""
    out = {}
    for item in (x for x in text.split(",") if x):
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value) if sep else None
        except ValueError:
            out[name.strip()] = None
        if out[name.strip()] is None or out[name.strip()] < 0:
            raise argparse.ArgumentTypeError(f"METHOD=SECONDS pairs (seconds >= 0), got {item!r}")
    return out


def scaled_compression(method, seconds, shapes, measured_ranks, ranks):
    """A method's kernel seconds per step measured at measured_ranks, at `ranks`: scaled as THROUGHPUT's encode and
    per-payload decode scale under the transport it takes at each (an allgather method decodes one payload per
    rank, two-phase and sparse_reduce one stream), constant for other methods."""
    if method not in THROUGHPUT:
        return seconds
    elements = sum(sizes_of(shapes))

    def model_seconds(n):
        return compression_seconds_of(transport_of(method, shapes, n)[1], elements, n)

    return seconds * model_seconds(ranks) / model_seconds(measured_ranks)


def speedups(model, compute, gbits, ranks, latency, per_node, methods, hierarchical=False, kernel_speedup=1.0,
             measured=None, measured_ranks=1):
    """{gbit: {method: [Prediction per rank count]}}. measured: {method: kernel seconds per step at measured_ranks}
    in place of THROUGHPUT / kernel_speedup for those methods."""
    measured = measured or {}
    out = {}
    for gbit in gbits:
        out[gbit] = {m: [] for m in methods}
        for n in ranks:
            g = min(per_node, n) if per_node else n
            cluster = Cluster(n, Link(gbit, latency), intra=Link(max(gbit, 100.0), latency), ranks_per_node=g,
                              hierarchical=hierarchical)
            for m in methods:
                kernels = (scaled_compression(m, measured[m], model["shapes"], measured_ranks, n) if m in measured
                           else None)
                out[gbit][m].append(predict(m, model["shapes"], compute, cluster, compression_seconds=kernels,
                                            kernel_speedup=kernel_speedup))
    return out


def label(method, row):
    """A method's name, with the transports it takes across the row's rank counts where it can take more than one
    (e.g. "ternary (allgather from 2, two_phase from 8)")."""
    transports = [(p.transport, p.ranks) for p in row if p.transport is not None]
    if not transports:
        return method
    spans = []
    for transport, n in transports:
        if not spans or spans[-1][0] != transport:
            spans.append((transport, n))
    if len(spans) == 1:
        return f"{method} ({spans[0][0]})"
    return f"{method} (" + ", ".join(f"{t} from {n}" for t, n in spans) + ")"


def markdown(model, compute, results, ranks):
    lines = [f"{model['name']}: {model['parameters'] / 1e6:.1f}M parameters in {len(model['shapes'])} tensors, "
             f"compute {compute * 1e3:.0f} ms per step. Speed-up over dense (float32 ring allreduce); the last "
             f"column is the step time at {ranks[-1]} ranks."]
    for gbit, by_method in results.items():
        lines += ["", f"{gbit:g} Gbit/s:", "",
                  "| method | " + " | ".join(str(n) for n in ranks) + f" | step ms at {ranks[-1]} |",
                  "|---" * (len(ranks) + 2) + "|"]
        order = sorted(by_method, key=lambda m: by_method[m][-1].step_seconds)
        for m in order:
            row = by_method[m]
            lines.append(f"| {label(m, row)} | " + " | ".join(f"{p.speedup_over_dense:.2f}" for p in row)
                         + f" | {row[-1].step_seconds * 1e3:.0f} |")
    return "\n".join(lines)


def plot(model, results, ranks, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, (gbit, by_method) in zip(axes[0], results.items()):
        for m, row in by_method.items():
            ax.plot(ranks, [p.speedup_over_dense for p in row], marker="o", markersize=3, label=m)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(title=f"{model['name']}, {gbit:g} Gbit/s", xlabel="ranks", ylabel="speed-up over dense", xscale="log",
               yscale="log")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m horovod_ext.perfmodel", description=__doc__.split("\n")[2])
    parser.add_argument("--model", required=True, help=f"one of {', '.join(NAMES)}, or a file of tensor shapes")
    parser.add_argument("--compute-seconds", type=float, help="forward + backward per step (default: the model's)")
    parser.add_argument("--gbit", type=lambda t: _numbers(t, float), default=[1.0, 10.0, 100.0])
    parser.add_argument("--ranks", type=lambda t: _numbers(t, int), default=RANKS)
    parser.add_argument("--ranks-per-node", type=int, default=8, help="0: every rank on its own node")
    parser.add_argument("--latency", type=float, default=50e-6, help="seconds per message (inter-node)")
    parser.add_argument("--hierarchical", action="store_true", help="Horovod's hierarchical allreduce/allgather")
    parser.add_argument("--methods", type=lambda t: t.split(","), default=sorted(METHODS))
    parser.add_argument("--kernel-speedup", type=float, default=1.0,
                        help="how much faster your compression kernels run than one CPU thread of the machine "
                             "perfmodel.THROUGHPUT was measured on (a GPU: 50-100)")
    parser.add_argument("--compression-seconds", type=_measured, default={}, metavar="METHOD=SECONDS,...",
                        help="each method's measured kernel seconds per step (compression_stats()' compress and "
                             "decompress seconds, or the launcher's 'compression' figure), in place of the "
                             "--kernel-speedup estimate")
    parser.add_argument("--measured-ranks", type=int, default=1,
                        help="the ranks --compression-seconds was measured at (allgather methods decode one "
                             "payload per rank, so theirs grows with the ranks)")
    parser.add_argument("--plot", metavar="PNG", help="write the speed-up plot there")
    args = parser.parse_args(argv)
    try:
        model = load(args.model)
    except ValueError as exc:
        parser.error(str(exc))
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; allowed values are {', '.join(sorted(METHODS))}")
    unknown = [m for m in args.compression_seconds if m not in METHODS]
    if unknown:
        parser.error(f"--compression-seconds: unknown method {unknown[0]!r}; allowed values are "
                     f"{', '.join(sorted(METHODS))}")
    if args.measured_ranks < 1:
        parser.error(f"--measured-ranks must be >= 1, got {args.measured_ranks}")
    compute = args.compute_seconds if args.compute_seconds is not None else model["compute_seconds"]
    if compute is None:
        parser.error(f"--compute-seconds is needed: {args.model} does not give a compute time")
    per_node = args.ranks_per_node or 1
    results = speedups(model, compute, args.gbit, args.ranks, args.latency, per_node, args.methods,
                       args.hierarchical, args.kernel_speedup, args.compression_seconds, args.measured_ranks)
    print(markdown(model, compute, results, args.ranks))
    if model.get("compute_note") and args.compute_seconds is None:
        print(f"\ncompute: {model['compute_note']}")
    if args.plot:
        plot(model, results, args.ranks, args.plot)
        print(f"\nwritten: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
