#!/usr/bin/env bash
# The GPU checks (the team's GPU.md) in one bounded run on a machine with a CUDA GPU, nvcc and a CUDA build of torch
# as `python3`, and no package index: everything it needs beyond that image travels in .whl/ (Horovod's sdist).
#
#   1. horovod_ext with its CUDA kernels (sm_90 only, for the build's time), tests/test_cuda.py, then
#      benchmarks/gpu_kernels.py (what goes through horovod_ext.torch waits for Horovod);
#   2. meanwhile Horovod 0.28.1 (with the wheels carried in .whl/) is built for that torch as set-up plans it (scripts/setup_plan.py: NCCL from the
#      CUDA torch's nvidia-nccl wheel), then examples/pytorch_digits.py on CUDA tensors under horovodrun -np 1 with
#      every compressor and each parameter-space optimizer (one launch each, side by side on the one GPU), and -np 2
#      on the one GPU;
#   3. benchmarks/perfmodel.py --quick at 2, 4 and 8 CPU ranks on shaped links, in the time that is left (where the
#      machine has ip and tc).
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
ls .whl/*.whl >/dev/null 2>&1 && $PY -m pip install -q --no-index --no-deps .whl/*.whl >>"$LOG/machine.log" 2>&1

# Horovod, in the background (its compile is the longest step).
(
  eval "$($PY scripts/setup_plan.py plan system-site)"
  export HVDEXT_HOROVOD_KEY HVDEXT_HOROVOD_ENV HVDEXT_HOROVOD_WANTS
  echo "plan: $HVDEXT_HOROVOD_KEY | $HVDEXT_HOROVOD_ENV"
  PY=$PY HVDEXT_HOROVOD_SDIST="$ROOT/.whl/horovod-0.28.1.tar.gz" bash scripts/build_horovod.sh
) >"$LOG/horovod_build.log" 2>&1 &
HOROVOD_BUILD=$!

step ext_build 240 env HVDEXT_WITH_CUDA=1 $PY setup.py build_ext --inplace
$PY -c "from horovod_ext import _torch_ops as o; print('built_with_cuda', o.built_with_cuda())" >>"$LOG/ext_build.log" 2>&1
# GraVAC's nested selection goes through horovod_ext.torch, which imports Horovod: it waits for the build.
step test_cuda 150 $PY -m pytest -q -p no:cacheprovider --tb=short -rfE -k "not nested" tests/test_cuda.py

while kill -0 $HOROVOD_BUILD 2>/dev/null && [ "$(left)" -gt 120 ]; do sleep 5; done
if kill -0 $HOROVOD_BUILD 2>/dev/null; then
  note "horovod_build: still compiling, stopped"
  kill $HOROVOD_BUILD
  pack
  exit 1
fi
wait $HOROVOD_BUILD
note "horovod_build: rc $? ($(grep -E '\[X\]|\[ \]' "$LOG/horovod_build.log" | tr -s ' \n' ' ' | cut -c1-200))"
pack
step test_cuda_nested 60 $PY -m pytest -q -p no:cacheprovider --tb=short -rfE -k nested tests/test_cuda.py
(cd benchmarks && step gpu_kernels 90 $PY gpu_kernels.py)
cp benchmarks/out/gpu_kernels.md benchmarks/out/gpu_kernels.json "$LOG/" 2>/dev/null
HOROVODRUN="$($PY -c 'import os, sys; print(os.path.dirname(sys.executable))')/horovodrun"

# Every compressor and optimizer on CUDA tensors, one launch each, side by side.
DIGITS=(examples/pytorch_digits.py --epochs 2)
pids=()
for c in none fp16 ternary ternary-shared ternary-2bit topk topk-allgather topk-1% adaptive_topk powersgd; do
  (step "digits_np1_$c" 150 "$HOROVODRUN" -np 1 $PY "${DIGITS[@]}" --compression "$c") & pids+=($!)
done
for o in lsgd multi_lsgd easgd async_lsgd async_easgd; do
  (step "digits_np1_$o" 150 "$HOROVODRUN" -np 1 $PY "${DIGITS[@]}" --optimizer "$o") & pids+=($!)
done
wait "${pids[@]}"
step digits_np2_nccl 60 env NCCL_DEBUG=WARN "$HOROVODRUN" -np 2 $PY "${DIGITS[@]}" --compression none,ternary
sed 's/^\[[0-9,]*\]<stdout>://' "$LOG"/digits_np*.log \
  | grep -E "^(digits|none|fp16|ternary|topk|adaptive|powersgd|lsgd|multi|easgd|async)" >"$LOG/digits_table.txt"

if command -v tc >/dev/null && command -v ip >/dev/null; then
  (cd benchmarks && step perfmodel $(($(left) - 5)) $PY perfmodel.py --quick --ranks 2,4,8 --timeout 120)
  cp benchmarks/out/perfmodel.md "$LOG/" 2>/dev/null
else
  note "perfmodel: not run (no ip or tc here to shape a link)"
fi
note "done"
pack
