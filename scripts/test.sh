#!/usr/bin/env bash
# The whole test suite: set up what is missing, then run pytest over tests/ (multi-process tests launch
# horovodrun themselves, each bounded by a timeout). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=3 OMP_NUM_THREADS=1
python -m pytest -q tests "$@"
