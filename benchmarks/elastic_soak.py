"""Elastic soak: 3 ranks (hosts localhost, 127.0.0.1 and a third name of this machine, one slot each) train the test
suite's MLP (tests/workers/elastic_worker.py) for 2,000 steps, committing every 10; every 200 steps the rank on
127.0.0.1 is SIGKILLed mid-step and 50 steps later a new one is added on that host. Per method: steps completed, resets,
seconds lost per reset (against the same run uninterrupted), resident memory of rank 0 after its first step and at the
end, held-out accuracy (4,096 examples; the learning rate decays to 0 by the last step, so both runs end
converged) against the uninterrupted run's. A launch that fails or hangs (--timeout) is a row
that says so, and the soak goes on; the table is written after every method.

    python benchmarks/elastic_soak.py                      # every method, 2,000 steps
    python benchmarks/elastic_soak.py --methods topk,lsgd --steps 1000
    python benchmarks/elastic_soak.py --quick              # top-k, 60 steps, one kill at step 30 (the test suite)
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from common import OUT_DIR, bar_plot, machine, markdown_table, progress, write_outputs  # noqa: E402
from hvdrun import horovodrun_elastic, third_host  # noqa: E402

WORKER = os.path.join("tests", "workers", "elastic_worker.py")
METHODS = ["none", "ternary", "ternary_allgather", "topk", "topk_sparse_reduce", "adaptive_topk", "powersgd", "lsgd",
           "async_lsgd", "easgd"]
HOSTS = ["localhost:1", "127.0.0.1:1"]
COMMIT_EVERY = 10


def run(method, steps, kills, adds, timeout):
    hosts = HOSTS + [f"{third_host()}:1"]
    start = time.perf_counter()
    results, output = horovodrun_elastic(WORKER, method, steps, ",".join(map(str, kills)) or "-1",
                                    ",".join(map(str, adds)) or "-1", COMMIT_EVERY, np_=3, min_np=2, max_np=3,
                                    hosts=hosts, timeout=timeout)
    wall = time.perf_counter() - start
    if kills:  # Horovod's driver log and the workers' output, for a run that went wrong without failing
        os.makedirs(OUT_DIR, exist_ok=True)
        with open(os.path.join(OUT_DIR, f"elastic_soak_{method}.log"), "w") as f:
            f.write(output)
    rank0 = next(r for r in results if r["rank"] == 0)
    ran = rank0["methods"][method]
    return {"wall_seconds": wall, "ranks_at_end": len(results), "step": rank0["step"], "trained": rank0["trained"],
            "resets": len(rank0["resets"]), "accuracy": ran["accuracy"], "rss_start": rank0["rss_start"],
            "rss_end": rank0["rss_end"],
            "identical": all(r["methods"][method]["params"] == ran["params"] for r in results),
            "stats_steps": ran["stats_steps"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=200, help="steps between kills")
    parser.add_argument("--readd", type=int, default=50, help="steps from a kill to the re-add")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--timeout", type=int, default=1200, help="seconds a launch may take before it counts as hung")
    args = parser.parse_args()
    if third_host() is None:
        print("[elastic_soak] skipped: this machine has no third local host name (its host name or an interface "
              "address) for the soak's third Horovod host")
        return
    steps, every, readd = (60, 30, 15) if args.quick else (args.steps, args.every, args.readd)
    methods = ["topk"] if args.quick else args.methods.split(",")
    kills = list(range(every, steps - readd, every))
    adds = [k + readd for k in kills]
    results, rows, lost = [], [], {}
    headers = ["method", "steps done", "resets", "ranks at end", "steps redone (rank 0)", "s lost per reset",
               "RSS MiB start (rank 0)", "RSS MiB end", "accuracy", "uninterrupted", "points", "ranks identical"]
    for method in progress(methods, "elastic soak"):
        try:
            plain = run(method, steps, [], [], args.timeout)
            faulty = run(method, steps, kills, adds, args.timeout)
        except AssertionError as failure:  # a hang (timeout) or a failed job: recorded, and the soak goes on
            reason = str(failure).splitlines()[0]
            results.append({"method": method, "failed": str(failure)[-4000:]})
            rows.append([method, f"FAILED: {reason}"] + [""] * (len(headers) - 2))
            lost[method] = {"s lost per reset": 0.0}
        else:
            per_reset = (faulty["wall_seconds"] - plain["wall_seconds"]) / max(1, faulty["resets"])
            lost[method] = {"s lost per reset": per_reset}
            results.append({"method": method, "uninterrupted": plain, "elastic": faulty,
                            "seconds_lost_per_reset": per_reset})
            mib = 2 ** 20
            rows.append([method, f"{faulty['step']}/{steps}", faulty["resets"], faulty["ranks_at_end"],
                         faulty["trained"] - steps,
                         f"{per_reset:.1f}", f"{faulty['rss_start'] / mib:.0f}", f"{faulty['rss_end'] / mib:.0f}",
                         f"{100 * faulty['accuracy']:.2f}%", f"{100 * plain['accuracy']:.2f}%",
                         f"{100 * (faulty['accuracy'] - plain['accuracy']):+.2f}",
                         "yes" if faulty["identical"] else "NO"])
        table = markdown_table(headers, rows)  # written after every method: a long soak keeps what it measured
        write_outputs("elastic_soak", {"machine": machine(), "steps": steps, "kills": kills, "adds": adds,
                                       "commit_every": COMMIT_EVERY, "results": results}, table)
    bar_plot(os.path.join(OUT_DIR, "elastic_soak_seconds_lost.png"),
             f"Seconds lost per reset (kill every {every} steps, re-add {readd} later), 3 ranks", lost, "s")
    print(table)


if __name__ == "__main__":
    main()
