"""The benchmark suite, one entry point:

    python benchmarks/run.py --quick      # every benchmark small (the test suite runs this)
    python benchmarks/run.py              # the full run recorded in benchmarks/RESULTS.md
    python benchmarks/run.py --only wire,link

Benchmarks: kernels (native ops vs torch ops / NumPy), tf_kernels (vs TF ops), gpu_kernels (the CUDA kernels as a
fraction of the GPU's memory bandwidth, top-k vs torch.topk; skipped where no GPU is), wire (bytes per step of every
compressor and optimizer, 2-64 ranks), coding (bits per element of the entropy-coded payloads on three models'
gradients, the coders' speed against the fixed packings, step time on 100 Mbit/s beside PowerSGD rank 4),
sparse_reduce (top-k's bytes per rank by allgather and by sparse_reduce, counted at 2-4 ranks and planned to 1024,
and step time at 4 ranks on 100 Mbit/s beside dense and PowerSGD rank 4), link (step time on loopback shaped to
100 Mbit/s and 1 Gbit/s, 2 and 4 ranks,
beside Horovod dense/fp16 and PyTorch DDP with its fp16 and PowerSGD hooks), powersgd (Compression.powersgd against
DDP's powerSGD_hook at ranks 1, 2 and 4 on 100 Mbit/s, 2 and 4 processes), tta (test accuracy against
wall-clock time on digits for every compressor and optimizer), gravac (GraVAC's time to dense's accuracy against
static top-k 10/100/1000x and PowerSGD on three models), perfmodel (horovod_ext.perfmodel's predicted step time
against the measured one at 2 and 4 ranks on 100 Mbit/s and 1 Gbit/s, then its table for ResNet-50, VGG-16 and
BERT-base at 8-1024 ranks) and soak (10,000 steps at 4 ranks per method: resident
memory and steps/s at steps 1,000 and 10,000) and elastic_soak (3 ranks, a worker killed every 200 steps and re-added
50 later, 2,000 steps per method: steps done, seconds lost per reset, memory, accuracy against an uninterrupted
run; skipped where this machine's host name is not a local address) and diloco (the transformer LM's test loss
against seconds and bytes on 100 Mbit/s: data-parallel AdamW dense, ternary and top-k against DiLoCo with dense,
ternary and top-k pseudo-gradients) and auto (Compression.auto's step over the best static method's, 3 models x 4
links x 2 and 4 ranks; --quick: the CNN on loopback) and rounds (what each compressor asks of Horovod per step:
collectives, dependent rounds, waits; rounds_worker.py). Each writes JSON, a markdown table and PNG plots to
benchmarks/out/ (or $HVDEXT_BENCH_OUT); this script adds summary.md with every table. link and tta create a network
namespace (root), as do powersgd, gravac, perfmodel, diloco, coding's and sparse_reduce's link parts; where that is not
allowed they say why and are skipped, not failed; so does gpu_kernels without a GPU.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import OUT_DIR, progress  # noqa: E402

BENCHMARKS = ["kernels", "tf_kernels", "gpu_kernels", "wire", "coding", "sparse_reduce", "link", "powersgd", "tta",
              "gravac", "perfmodel", "soak", "elastic_soak", "diloco", "auto", "rounds"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="every benchmark at its smallest (minutes)")
    parser.add_argument("--only", default=",".join(BENCHMARKS),
                        help=f"comma-separated subset of {', '.join(BENCHMARKS)}")
    args = parser.parse_args(argv)
    names = args.only.split(",")
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"--only: unknown {unknown}; allowed values are {', '.join(BENCHMARKS)}")
    os.makedirs(OUT_DIR, exist_ok=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    report, failed = [], []
    for name in progress(names, "benchmarks"):
        start = time.perf_counter()
        cmd = [sys.executable, os.path.join(HERE, f"{name}.py")] + (["--quick"] if args.quick else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        log = os.path.join(OUT_DIR, f"{name}.log")
        with open(log, "w") as f:
            f.write(proc.stdout + proc.stderr)
        skipped = [line for line in proc.stdout.splitlines() if line.startswith(f"[{name}] skipped:")]
        status = "failed" if proc.returncode else ("skipped" if skipped else "ok")
        print(f"[run] {name}: {status} in {seconds:.0f} s" + (f" ({skipped[0]})" if skipped else ""), flush=True)
        if proc.returncode:
            failed.append(name)
            print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
        table = os.path.join(OUT_DIR, f"{name}.md")
        body = open(table).read() if status == "ok" and os.path.exists(table) else \
            f"{status}: {skipped[0] if skipped else 'see ' + log}"
        report.append(f"## {name} ({status}, {seconds:.0f} s)\n\n{body}\n")
    mode = "--quick" if args.quick else "full"
    with open(os.path.join(OUT_DIR, "summary.md"), "w") as f:
        f.write(f"# horovod-ext benchmarks ({mode})\n\n" + "\n".join(report))
    print(f"[run] written: {os.path.join(OUT_DIR, 'summary.md')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
