#!/usr/bin/env bash
# Sets up everything horovod-ext needs on a fresh machine, and does nothing that is already done.
#
#   1. a virtual environment: the active one, else .venv/ at the repo root;
#   2. the pinned frameworks (torch 2.13.0 CPU, tensorflow-cpu 2.21.0) and the tools the tests use;
#   3. Horovod 0.28.1 from its sdist with Gloo, PyTorch and TensorFlow, patched by scripts/build_horovod.sh
#      (the wheel is cached, so a second machine set-up on the same host skips the compile);
#   4. horovod_ext itself (editable) with its native ops, rebuilt only when cpp/ changed.
#
# Source it (". scripts/setup.sh") to keep the environment active in the calling shell.
set -euo pipefail
HVDEXT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$HVDEXT_ROOT"

log() { echo "[setup] $*" >&2; }

if [ -z "${VIRTUAL_ENV:-}" ]; then
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv
  fi
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
PY=python
export PIP_DISABLE_PIP_VERSION_CHECK=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3}
# pip older than 23.3 installs editable packages through "setup.py develop", which loses --no-build-isolation.
if ! $PY -c "import sys, pip; sys.exit(int(pip.__version__.split('.')[0]) < 24)" 2>/dev/null; then
  $PY -m pip install -q --upgrade "pip>=24"
fi

if ! $PY - <<'PY' 2>/dev/null
import importlib.metadata as md, sys
want = {"torch": "2.13.0", "tensorflow-cpu": "2.21.0"}
for name, version in want.items():
    if not md.version(name).startswith(version):
        sys.exit(1)
import numpy, sklearn, pytest, psutil, yaml, cloudpickle, matplotlib, tqdm  # noqa: F401
PY
then
  log "installing the pinned frameworks and test tools (requirements.txt)"
  $PY -m pip install -q -r requirements.txt
fi

if ! $PY -c "import horovod.torch as t, horovod.tensorflow as f; assert t.gloo_built() and f.gloo_built()" 2>/dev/null; then
  log "building Horovod 0.28.1 (first time on this machine: several minutes)"
  bash scripts/build_horovod.sh
fi

# Checked from / so that the repo root on sys.path cannot stand in for the installed package.
if ! (cd / && $PY -c "import horovod_ext, hvdext_reference, sys
sys.exit(0 if horovod_ext.__file__.startswith('$HVDEXT_ROOT/') else 1)") 2>/dev/null; then
  log "installing horovod_ext (editable)"
  $PY -m pip install -q --no-build-isolation --no-deps -e .
fi
# build_ext compares timestamps: this is a no-op when cpp/ has not changed since the last build.
$PY setup.py -q build_ext --inplace >/dev/null
