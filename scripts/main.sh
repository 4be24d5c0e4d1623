#!/usr/bin/env bash
# The main job: set up what is missing, then train the digits MLP with 2 Horovod processes over loopback shaped to a
# 100 Mbit/s link (a network namespace made here and always removed: python benchmarks/shaped_link.py), dense and
# compressed, and print test accuracy, bytes per step and wall-clock training time side by side. Where no namespace
# can be made (not root, no iproute2) it says why and trains on plain loopback. HVDEXT_LINK_MBIT sets the rate;
# extra arguments go to the example script (e.g. --compression none,ternary --epochs 10).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=3 OMP_NUM_THREADS=1
timeout 900 python benchmarks/shaped_link.py --mbit "${HVDEXT_LINK_MBIT:-100}" --or-unshaped -- \
  horovodrun -np 2 -H localhost:2 --gloo python examples/pytorch_digits.py --compression none,ternary,topk "$@" 2>&1 \
  | grep -v -e "^I0000" -e "oneDNN" -e "absl::InitializeLog"
