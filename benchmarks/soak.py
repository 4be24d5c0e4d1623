"""Soak: 10,000 steps at 4 ranks (two "nodes" of 2) with each compressor and each leader optimizer on a small MLP;
resident memory per rank and steps per second at steps 1,000 and 10,000. Goal: memory flat within 5%.

    python benchmarks/soak.py            # 10,000 steps per method
    python benchmarks/soak.py --steps 3000   # read at steps 1,000 and 3,000
    python benchmarks/soak.py --quick    # 2 ranks, 200 steps, one compressor of each kind (the test suite runs it)
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import OUT_DIR, bar_plot, horovodrun_json, machine, markdown_table, progress, write_outputs  # noqa: E402
from soak_worker import METHODS  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10000, help="steps per method; memory and speed are read at "
                        "step 1,000 (a tenth of the steps below 10,000) and at the last step")
    args = parser.parse_args()
    steps = 200 if args.quick else args.steps
    checkpoints = f"{min(1000, steps // 4)},{steps}"
    ranks = 2 if args.quick else args.ranks
    methods = ["none", "adaptive_topk", "lsgd"] if args.quick else METHODS
    hosts = "localhost:2,127.0.0.1:2" if ranks == 4 else None
    results, rows, growth = [], [], {}
    for method in progress(methods, "soak"):
        result = horovodrun_json([], ranks, os.path.join(HERE, "soak_worker.py"),
                                 ["--method", method, "--steps", steps, "--checkpoints", checkpoints],
                                 timeout=3600, hosts=hosts)
        first, last = result["records"]
        change = max(b / a - 1 for a, b in zip(first["rss_mib"], last["rss_mib"]))
        growth[method] = {"RSS growth %": 100 * change}
        results.append({**result, "rss_growth": change})
        rows.append([method, f"{max(first['rss_mib']):.0f}", f"{max(last['rss_mib']):.0f}", f"{100 * change:+.1f}%",
                     f"{first['steps_per_second']:.0f}", f"{last['steps_per_second']:.0f}",
                     f"{last['steps_per_second'] / first['steps_per_second']:.2f}"])
    a, b = checkpoints.split(",")
    table = markdown_table(["method", f"max RSS MiB @ {a}", f"max RSS MiB @ {b}", "RSS growth (worst rank)",
                            f"steps/s @ {a}", f"steps/s @ {b}", "steps/s ratio"], rows)
    write_outputs("soak", {"machine": machine(), "ranks": ranks, "steps": steps, "results": results}, table)
    bar_plot(os.path.join(OUT_DIR, "soak_rss_growth.png"), f"Resident memory growth, step {a} to {b}, "
             f"{ranks} ranks", growth, "% (worst rank)")
    print(table)


if __name__ == "__main__":
    main()
