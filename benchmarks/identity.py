"""Identity check for refactors: every rank's applied bits, per method, before and after a change.

Runs benchmarks/identity_worker.py under `horovodrun -np 2 --gloo` (PyTorch, then TensorFlow eager and
tf.function): every compressor and both leader optimizers (sync and async) train a small MLP for a few steps on
fixed seeds, and each rank reports the SHA-256 of its parameters.

    python benchmarks/identity.py --save before.json          # on the old commit
    python benchmarks/identity.py --compare before.json       # on the new one: a table, exit 1 if any differs

PyTorch's configurations and TensorFlow's tapes also run under other bucket_cap_mb (identity_worker.BUCKET_CAPS),
keyed "torch/bucket_cap_mb=C/..." ("tf-eager/bucket_cap_mb=C/..."): each must give the bits of its default-cap
twin ("torch/...") in the same run;
without --compare, a line per configuration, and exit 1 if a bucketed one differs from its twin.
"""
import re
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def measure(timeout=900):
    """{configuration: [digest of rank 0, digest of rank 1]}."""
    table = {}
    with tempfile.TemporaryDirectory(prefix="hvdext-identity-") as tmp:
        for framework in ("torch", "tf"):
            cmd = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                   os.path.join(HERE, "identity_worker.py"), framework, os.path.join(tmp, "out")]
            env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            if proc.returncode:
                raise SystemExit(f"{framework} run failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
            for path in sorted(glob.glob(os.path.join(tmp, f"out.{framework}.rank*.json"))):
                with open(path) as f:
                    for key, value in json.load(f).items():
                        table.setdefault(key, []).append(value)
    return table


BUCKETED = re.compile(r"^(torch|tf-eager)/bucket_cap_mb=[^/]+/")


def bucket_differences(table):
    """The bucketed configurations whose bits differ from their default-cap twin's."""
    return sorted(key for key in table if BUCKETED.match(key) and table[key] != table.get(BUCKETED.sub(r"\1/", key)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--save", help="write the measured table to this JSON file")
    parser.add_argument("--compare", help="compare the measured table with this saved one")
    args = parser.parse_args()
    table = measure()
    if args.save:
        with open(args.save, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
    if not args.compare:
        for key, digests in sorted(table.items()):
            print(f"{key:40s} {' '.join(digests)}")
        differ = bucket_differences(table)
        print(f"{len(differ)} bucketed configurations differ from their default-cap twin: {differ}")
        return 1 if differ else 0
    with open(args.compare) as f:
        before = json.load(f)
    differ = 0
    print("| configuration | ranks agree | before == after |\n|---|---|---|")
    for key in sorted(set(before) | set(table)):
        old, new = before.get(key), table.get(key)
        if old is None and BUCKETED.match(key):  # a saved table from before buckets: against its twin
            old = table.get(BUCKETED.sub(r"\1/", key))
        same = old == new
        differ += not same
        agree = new is not None and len(set(new)) == 1
        print(f"| {key} | {'yes' if agree else 'no'} | {'yes' if same else f'NO ({old} -> {new})'} |")
    print(f"{len(table) - differ} identical, {differ} different")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
