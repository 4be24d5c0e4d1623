#!/usr/bin/env bash
# The GPU checks (the team's GPU.md) in one bounded run on a machine with a CUDA GPU, nvcc and a CUDA build of torch
# (and torchvision) as `python3`, and no package index: everything it needs beyond that image travels in .whl/:
# Horovod's sdist (horovod-0.28.1.tar.gz), the wheels Horovod's build lacks there (cffi, pycparser) and Horovod's own
# examples/pytorch/pytorch_synthetic_benchmark.py.
#
#   1. horovod_ext with its CUDA kernels (sm_90 only, for the build's time), tests/test_cuda.py (its cases through
#      horovod_ext.torch wait for Horovod), and last, where time is left, benchmarks/gpu_kernels.py;
#   2. meanwhile Horovod 0.28.1 is built twice for that torch as set-up plans it (scripts/setup_plan.py): with NCCL
#      from the CUDA torch's nvidia-nccl wheel, installed, and without NCCL (HVDEXT_HOROVOD_NCCL=0: CUDA tensors go
#      through Gloo on the host) into a folder of its own ($GLOO_HOROVOD, put first on PYTHONPATH where used);
#   3. Horovod's pytorch_synthetic_benchmark.py (torchvision's ResNet-50, synthetic data, batch 64) under horovodrun
#      -np 1 through `python -m horovod_ext.run --compression X`, one method after the other, with
#      HVDEXT_SYNC_TIMING=1 so that the launcher's per-step compression seconds hold the CUDA kernels' time; then
#      `python -m horovod_ext.perfmodel` projects the speed-up over dense at 8, 16 and 64 GPUs on 10, 25 and 100
#      Gbit/s from the measured compute and compression seconds;
#   4. examples/pytorch_digits.py on CUDA tensors under horovodrun -np 2 on the one GPU with the Horovod without
#      NCCL (NCCL refuses two ranks on one device), every compressor and optimizer, one launch each, side by side:
#      the table's "spread" column is the largest difference between the ranks' parameters (0 for data-parallel);
#      ternary runs twice, and its "params" column (CRC-32 of the parameters) must be the same both times.
#
#   5. buckets: step 3 again for ternary, top-k and PowerSGD with --bucket-cap-mb 0 (one tensor per bucket) beside
#      the default 25, and tests/test_cuda.py's step under torch's sync debug mode;
#   6. DDP: benchmarks/ddp_synthetic.py (the same ResNet-50 step under DDP at one rank over NCCL: DDP alone, torch's
#      fp16 and PowerSGD hooks, horovod-ext's hooks), and examples/ddp_digits.py at 2 ranks on the one GPU over Gloo
#      (CUDA tensors) with every hook: replicas identical, accuracy as on the CPU.
#
# SYNTHETIC_METHODS, UNBUCKETED_METHODS and DDP_HOOKS set empty leave those rows out (for a lease that has to reach
# the -np 2 runs and the kernels' timing, which come last).
# ONLY=synthetic runs step 3 alone (with the builds it needs: no second Horovod, no CUDA tests, no kernels' timing,
# no two-rank runs), for a short lease; SYNTHETIC_METHODS picks the per-step methods (default: none fp16 ternary topk
# powersgd), and DILOCO=0 leaves out DiLoCo (--optimizer diloco: ternary pseudo-gradients with error feedback every
# DILOCO_INNER_STEPS steps, default 5).
#
# Each step has its own deadline and log; after each, $OUT (default /tmp/gpu_checks) gets summary.txt (what passed),
# the benchmarks' tables and logs.tar.gz (every log). BUDGET (seconds, default 560) is the whole run's.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT=${OUT:-/tmp/gpu_checks}
LOG=$(mktemp -d)
BUDGET=${BUDGET:-560}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT:$ROOT/python" PIP_DISABLE_PIP_VERSION_CHECK=1 TORCH_CUDA_ARCH_LIST=9.0
PY=python3
T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET - $(elapsed))); }
note() { echo "[$(elapsed)s] $*" | tee -a "$LOG/summary.txt"; }
pack() {  # what comes back: a few files (the device tool returns at most 8)
  cp "$LOG/summary.txt" "$OUT/"
  cp "$LOG"/*.md "$LOG/digits_table.txt" "$OUT/" 2>/dev/null
  tar -czf "$OUT/logs.tar.gz" -C "$LOG" .
}
step() {  # step NAME SECONDS COMMAND...: runs it with a deadline, its output in $LOG/NAME.log
  local name=$1 seconds=$2
  shift 2
  [ "$seconds" -gt "$(left)" ] && seconds=$(left)
  if [ "$seconds" -le 5 ]; then note "$name: no time left"; return 1; fi
  timeout "$seconds" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  note "$name: rc $rc ($(tail -n 1 "$LOG/$name.log" | cut -c1-160))"
  pack
  return $rc
}

{
  nvidia-smi -L
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  nvcc --version | tail -n 2
  nproc
  for tool in ip tc mpicxx; do echo "$tool: $(command -v $tool || echo absent)"; done
} >"$LOG/machine.log" 2>&1
note "machine: $(head -n 2 "$LOG/machine.log" | tr '\n' ' ')"

# Wheels the image lacks (Horovod's build needs cffi for PyTorch), carried in .whl/.
GLOO_HOROVOD=${GLOO_HOROVOD:-/tmp/horovod_gloo}
ls .whl/*.whl >/dev/null 2>&1 && $PY -m pip install -q --no-index --no-deps .whl/*.whl >>"$LOG/machine.log" 2>&1

# Horovod twice, in the background (its compile is the longest step).
build_horovod() {  # build_horovod NCCL(auto|0) [TARGET]
  eval "$(HVDEXT_HOROVOD_NCCL=$1 $PY scripts/setup_plan.py plan system-site)"
  export HVDEXT_HOROVOD_KEY HVDEXT_HOROVOD_ENV HVDEXT_HOROVOD_WANTS
  echo "plan: $HVDEXT_HOROVOD_KEY | $HVDEXT_HOROVOD_ENV"
  PY=$PY HVDEXT_HOROVOD_TARGET=${2:-} HVDEXT_HOROVOD_SDIST="$ROOT/.whl/horovod-0.28.1.tar.gz" bash scripts/build_horovod.sh
}
(build_horovod auto) >"$LOG/horovod_build.log" 2>&1 &
HOROVOD_BUILD=$!
ONLY=${ONLY:-all}
GLOO_BUILD=
if [ "$ONLY" = all ]; then
  (build_horovod 0 "$GLOO_HOROVOD") >"$LOG/horovod_gloo_build.log" 2>&1 &
  GLOO_BUILD=$!
fi

step ext_build 240 env HVDEXT_WITH_CUDA=1 $PY setup.py build_ext --inplace
$PY -c "from horovod_ext import _torch_ops as o; print('built_with_cuda', o.built_with_cuda())" >>"$LOG/ext_build.log" 2>&1
# GraVAC's nested selection goes through horovod_ext.torch, which imports Horovod: it waits for the build.
[ "$ONLY" = all ] && step test_cuda 150 $PY -m pytest -q -p no:cacheprovider --tb=short -rfE \
  -k "not nested and not synchronizes" tests/test_cuda.py
# DDP's hooks at 2 ranks on the one GPU over Gloo (CUDA tensors), while Horovod compiles: no timing, only values
DDP_DIGITS_HOOKS=${DDP_DIGITS_HOOKS:-ddp,torch-powersgd,none,fp16,ternary,topk,topk-1%,adaptive_topk,powersgd,auto}
[ "$ONLY" = all ] && step ddp_digits_np2 150 $PY -m torch.distributed.run --standalone --nproc_per_node 2 \
  examples/ddp_digits.py --epochs 2 --hook "$DDP_DIGITS_HOOKS"

wait_build() {  # wait_build PID NAME: 0 once it built, else says why
  while kill -0 "$1" 2>/dev/null && [ "$(left)" -gt 90 ]; do sleep 3; done
  if kill -0 "$1" 2>/dev/null; then
    note "$2: still compiling, stopped"
    kill "$1"
    return 1
  fi
  wait "$1"
  local rc=$?
  note "$2: rc $rc ($(grep -E '\[X\]|\[ \]' "$LOG/$2.log" | tr -s ' \n' ' ' | cut -c1-200))"
  pack
  return $rc
}
wait_build $HOROVOD_BUILD horovod_build || { pack; exit 1; }
if [ "$ONLY" = all ]; then
  step test_cuda_horovod 90 $PY -m pytest -q -p no:cacheprovider --tb=short -rfE -k "nested or synchronizes" \
    tests/test_cuda.py
fi
# horovodrun of whichever Horovod PYTHONPATH finds first
HOROVODRUN="$LOG/horovodrun"
printf '#!/bin/sh\nexec %s -c "from horovod.runner.launch import run_commandline; run_commandline()" "$@"\n' "$PY" \
  >"$HOROVODRUN"
chmod +x "$HOROVODRUN"

# A real model's step: Horovod's synthetic benchmark through the launcher, one method at a time on the GPU.
SYNTHETIC=(.whl/pytorch_synthetic_benchmark.py --batch-size 64 --num-warmup-batches 10 --num-iters 5)
for c in ${SYNTHETIC_METHODS-none fp16 ternary topk powersgd}; do
  step "synthetic_$c" 90 env HVDEXT_SYNC_TIMING=1 "$HOROVODRUN" -np 1 $PY -m horovod_ext.run --compression "$c" \
    "${SYNTHETIC[@]}"
done
for c in ${UNBUCKETED_METHODS-ternary topk powersgd}; do  # one tensor per bucket, beside the default 25 MB
  step "synthetic_${c}_b0" 90 env HVDEXT_SYNC_TIMING=1 "$HOROVODRUN" -np 1 $PY -m horovod_ext.run --compression "$c" \
    --bucket-cap-mb 0 "${SYNTHETIC[@]}"
done
# The same ResNet-50 step under DDP at one rank over NCCL, with each hook
DDP_HOOKS=${DDP_HOOKS-ddp,torch-fp16,torch-powersgd,fp16,ternary,topk-1%,powersgd}
[ -n "$DDP_HOOKS" ] && step ddp_synthetic 150 env HVDEXT_SYNC_TIMING=1 $PY -m torch.distributed.run --standalone --nproc_per_node 1 \
  benchmarks/ddp_synthetic.py --hooks "$DDP_HOOKS" --json "$LOG/ddp_synthetic.json"
grep '^|\|^resnet' "$LOG/ddp_synthetic.log" >"$LOG/ddp_synthetic.md" 2>/dev/null
if [ "${DILOCO:-1}" = 1 ]; then  # the script's DistributedOptimizer as DiLoCo: a round every DILOCO_INNER_STEPS
  step "synthetic_diloco" 90 env HVDEXT_SYNC_TIMING=1 "$HOROVODRUN" -np 1 $PY -m horovod_ext.run --optimizer diloco \
    --optimizer-arg "inner_steps=${DILOCO_INNER_STEPS:-5}" --compression ternary --compression-arg error_feedback=True \
    "${SYNTHETIC[@]}"
fi
$PY - "$LOG" >"$LOG/synthetic_table.md" 2>&1 <<'TABLE'
import glob, os, re, sys
rows = ["| method | img/s | step ms | compute ms | compression ms | of the step | ratio |", "|---" * 7 + "|"]
perf = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "synthetic_*.log")), key=os.path.getmtime):
    text, name = open(path).read(), os.path.basename(path)[10:-4]
    img = re.search(r"Img/sec per GPU: ([0-9.]+)", text)
    line = re.search(r"ratio ([0-9.inf]+)x.*per step ([0-9.]+) ms, compute ([0-9.]+) ms, compression ([0-9.]+) ms", text)
    if not (img and line):
        rows.append(f"| {name} | failed | | | | | |")
        continue
    step, compute, kernels = (float(line.group(i)) for i in (2, 3, 4))
    rows.append(f"| {name} | {float(img.group(1)):.1f} | {step:.1f} | {compute:.1f} | {kernels:.2f} | "
                f"{100 * kernels / step:.1f}% | {line.group(1)}x |")
    if not name.endswith("_b0"):
        perf.append((name.replace("none", "dense"), compute, kernels))
print("\n".join(rows))
if perf:
    compute = dict((n, c) for n, c, _ in perf).get("dense", perf[0][1])
    print(f"\nPERFMODEL --compute-seconds {compute / 1e3:.5f} --compression-seconds "
          + ",".join(f"{n}={k / 1e3:.5f}" for n, c, k in perf if n not in ("dense", "fp16", "diloco")))
TABLE
cat "$LOG/synthetic_table.md" | tee -a "$LOG/summary.txt"
measured=$(sed -n 's/^PERFMODEL //p' "$LOG/synthetic_table.md")
if [ -n "$measured" ] && [ "$ONLY" = all ]; then
  # shellcheck disable=SC2086
  step perfmodel_projection 30 $PY -m horovod_ext.perfmodel --model resnet50 $measured --gbit 10,25,100 \
    --ranks 8,16,64 --methods dense,fp16,ternary,topk,powersgd
  cp "$LOG/perfmodel_projection.log" "$LOG/perfmodel_projection.md"
fi

# Two ranks on one GPU: CUDA tensors through Gloo on the host.
if [ -n "$GLOO_BUILD" ] && wait_build $GLOO_BUILD horovod_gloo_build; then
  DIGITS=(examples/pytorch_digits.py --epochs 2)
  pids=()
  for c in none fp16 ternary ternary-shared ternary-2bit topk topk-allgather topk-1% adaptive_topk powersgd; do
    (step "digits_np2_$c" 150 env PYTHONPATH="$GLOO_HOROVOD:$PYTHONPATH" "$HOROVODRUN" -np 2 --gloo $PY \
      "${DIGITS[@]}" --compression "$c") & pids+=($!)
  done
  # the same seeded ternary run twice: the "params" column (a CRC-32 of the parameters) must repeat
  (step "digits_np2_ternary_again" 150 env PYTHONPATH="$GLOO_HOROVOD:$PYTHONPATH" "$HOROVODRUN" -np 2 --gloo $PY \
    "${DIGITS[@]}" --compression ternary) & pids+=($!)
  for o in lsgd multi_lsgd easgd async_lsgd async_easgd; do
    (step "digits_np2_$o" 150 env PYTHONPATH="$GLOO_HOROVOD:$PYTHONPATH" "$HOROVODRUN" -np 2 --gloo $PY \
      "${DIGITS[@]}" --optimizer "$o") & pids+=($!)
  done
  wait "${pids[@]}"
  sed 's/^\[[0-9,]*\]<stdout>://' "$LOG"/digits_np*.log \
    | grep -E "^(run|digits|none|fp16|ternary|topk|adaptive|powersgd|lsgd|multi|easgd|async)" >"$LOG/digits_table.txt"
fi
grep -E "^(hook|digits|ddp|torch|none|fp16|ternary|topk|adaptive|powersgd|auto)" "$LOG/ddp_digits_np2.log" \
  >>"$LOG/digits_table.txt" 2>/dev/null
[ "$ONLY" = all ] && (cd benchmarks && step gpu_kernels 90 $PY gpu_kernels.py)  # last: a regression of round 7's
cp benchmarks/out/gpu_kernels.md "$LOG/" 2>/dev/null
note "done"
pack
