#!/usr/bin/env bash
# The whole test suite: make OpenMPI available (Debian's openmpi-bin and libopenmpi-dev, where apt-get can install
# them, so that Horovod is built with MPI and tests/test_mpi.py runs under horovodrun --mpi and mpirun), set up
# what is missing, then run pytest over tests/ (multi-process tests launch horovodrun or mpirun themselves, each
# bounded by a timeout). HVDEXT_INSTALL_MPI=0 skips the OpenMPI step. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v mpicxx >/dev/null && [ "${HVDEXT_INSTALL_MPI:-1}" != 0 ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[test] installing OpenMPI (Debian's openmpi-bin, libopenmpi-dev)" >&2
    timeout 900 bash -c "DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev >/dev/null"
  else
    echo "[test] OpenMPI is not installed and apt-get cannot install it here (not root, or no apt-get): the MPI" \
         "tests skip (CI=true fails them)" >&2
  fi
fi
. scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=3 OMP_NUM_THREADS=1
python -m pytest -q tests "$@"
