"""horovod-ext's DDP hooks against torch's own, in one DDP script (examples/ddp_digits.py) under torchrun: seconds
per step, bytes per step and test accuracy of every hook, with each step time as a ratio to torch's PowerSGD hook
(rank 4, start_powerSGD_iter=3) and to DDP without a hook, unshaped and on a shaped loopback.

    python benchmarks/ddp_hooks.py --ranks 2,4 --mbit 0,100
    python benchmarks/ddp_hooks.py --data synthetic --model-size 10.5e6 --epochs 1 --mbit 100 --bucket-cap-mb 200 \
        --hooks torch-powersgd,ternary,topk-1%,powersgd

--mbit 0 runs on plain loopback; a rate > 0 inside a network namespace whose loopback is shaped to it
(benchmarks/shaped_link.py: root and iproute2). One run per configuration; the ratios are of that run.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOOKS = "ddp,torch-fp16,torch-powersgd,ternary,topk-1%,powersgd,auto"


def run(ranks, mbit, args):
    """{hook: result} of one examples/ddp_digits.py launch."""
    out = os.path.join(tempfile.mkdtemp(prefix="hvdext-ddp-hooks-"), "digits.json")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
               "examples/ddp_digits.py", "--hook", args.hooks, "--epochs", str(args.epochs), "--data", args.data,
               "--model-size", str(args.model_size), "--bucket-cap-mb", str(args.bucket_cap_mb), "--json", out]
    if mbit:
        command = [sys.executable, "benchmarks/shaped_link.py", "--mbit", f"{mbit:g}", "--", *command]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        if not os.path.exists(out):
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
        print(f"[ddp_hooks] the launch exited {done.returncode} after rank 0 wrote its results", flush=True)
    with open(out) as f:
        return {r["hook"]: r for r in json.load(f)["results"]}


def table(ranks, mbit, runs):
    link = f"{mbit:g} Mbit/s" if mbit else "unshaped"
    lines = [f"### {ranks} ranks, {link}", "",
             "| hook | test acc | ms/step | vs torch PowerSGD | vs DDP | bytes/step | wire ratio |",
             "|---|---|---|---|---|---|---|"]
    reference = runs.get("torch-powersgd", {}).get("step_ms")
    ddp = runs.get("ddp", {}).get("step_ms")
    for hook, r in runs.items():
        vs_powersgd = f"{reference / r['step_ms']:.2f}x" if reference else "-"
        vs_ddp = f"{ddp / r['step_ms']:.2f}x" if ddp else "-"
        wire = r["dense_wire_bytes_per_step"] / r["wire_bytes_per_step"]
        lines.append(f"| {hook} | {100 * r['test_accuracy']:.2f}% | {r['step_ms']:.2f} | {vs_powersgd} | {vs_ddp} | "
                     f"{r['bytes_per_step']:.0f} | {wire:.1f}x |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="2", help="comma-separated rank counts (default 2)")
    parser.add_argument("--mbit", default="0,100", help="comma-separated link rates; 0: unshaped (default 0,100)")
    parser.add_argument("--hooks", default=HOOKS, help=f"examples/ddp_digits.py's --hook (default {HOOKS})")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--data", choices=["digits", "synthetic"], default="digits")
    parser.add_argument("--model-size", type=float, default=1e6, help="the synthetic MLP's parameters")
    parser.add_argument("--bucket-cap-mb", type=float, default=25,
                        help="DDP's bucket_cap_mb (default 25; torch's PowerSGD hook over Gloo hung on the shaped "
                             "link with the 10.5M MLP's several buckets, and runs with 200: one bucket)")
    args = parser.parse_args()
    for ranks in map(int, args.ranks.split(",")):
        for mbit in map(float, args.mbit.split(",")):
            print(table(ranks, mbit, run(ranks, mbit, args)), "\n", flush=True)


if __name__ == "__main__":
    main()
