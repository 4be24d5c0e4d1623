#!/usr/bin/env bash
# The main job: set up what is missing, then train an MLP on digits with 2 Horovod processes, dense and ternary,
# and print test accuracy and bytes per step beside each other. Extra arguments go to the example script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=3 OMP_NUM_THREADS=1
timeout 900 horovodrun -np 2 -H localhost:2 --gloo python examples/pytorch_digits.py "$@" 2>&1 \
  | grep -v -e "^I0000" -e "oneDNN" -e "absl::InitializeLog"
