#!/usr/bin/env bash
# Sets up everything horovod-ext needs, keeping what the machine already has, and does nothing that is already done.
# The decisions are scripts/setup_plan.py's (its docstring has the rules; each is logged with its reason):
#
#   1. the environment: the active one (VIRTUAL_ENV or CONDA_PREFIX), with its own torch and/or TensorFlow (CUDA
#      builds included; a version outside the supported range stops here with a message, nothing is replaced);
#      else .venv/ at the repo root, seeing the base python3's frameworks where it has supported ones
#      (--system-site-packages), else fresh with the pinned CPU builds (torch 2.13.0, tensorflow-cpu 2.21.0);
#   2. the tools the tests and benchmarks use (requirements-tools.txt), never a framework;
#   3. Horovod 0.28.1 from its sdist for the frameworks present, with Gloo, MPI where OpenMPI is found and NCCL where
#      torch is a CUDA build and NCCL is found (scripts/build_horovod.sh; the wheel is cached, keyed by these
#      choices, so a second set-up on the same host skips the compile); an installed Horovod is kept when
#      `horovodrun --check-build` shows all of them;
#   4. horovod_ext itself (editable) with its native ops, rebuilt only when cpp/ changed.
#
# HVDEXT_FRESH_VENV=1 makes .venv fresh whatever python3 has; HVDEXT_HOROVOD_MPI=0 / HVDEXT_HOROVOD_NCCL=0 build
# Horovod without MPI / NCCL. Source it (". scripts/setup.sh") to keep the environment active in the calling shell.
set -euo pipefail
HVDEXT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$HVDEXT_ROOT"

log() { echo "[setup] $*" >&2; }

# The user's environment: an active virtual environment other than our .venv, or an active conda one.
active_environment() {
  if [ -n "${VIRTUAL_ENV:-}" ]; then
    [ "$(cd "$VIRTUAL_ENV" 2>/dev/null && pwd -P)" != "$(pwd -P)/.venv" ]
  else
    [ -n "${CONDA_PREFIX:-}" ]
  fi
}

if active_environment; then
  HVDEXT_MODE=active
  log "using the active environment ${VIRTUAL_ENV:-$CONDA_PREFIX}"
else
  if [ ! -x .venv/bin/python ]; then
    # python3's own interpreter, or the one a virtual environment on PATH (not active) was made from
    base_python=$(python3 scripts/setup_plan.py base-python) || exit 2
    if [ "$base_python" != "$(python3 -c 'import sys; print(sys.executable)')" ]; then
      log "python3 on PATH is a virtual environment's (not active): .venv is made from $base_python"
    fi
    how=fresh
    if [ "${HVDEXT_FRESH_VENV:-0}" != 1 ]; then
      how=$("$base_python" scripts/setup_plan.py environment) || exit 2
    fi
    if [ "$how" = system-site ]; then
      log "creating .venv over python3's own frameworks (--system-site-packages)"
      "$base_python" -m venv --system-site-packages .venv
    else
      log "creating .venv"
      "$base_python" -m venv .venv
    fi
  fi
  # shellcheck disable=SC1091
  . .venv/bin/activate
  HVDEXT_MODE=fresh
  if grep -q "include-system-site-packages = true" .venv/pyvenv.cfg; then HVDEXT_MODE=system-site; fi
fi
PY=python
export PIP_DISABLE_PIP_VERSION_CHECK=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3}
# Decided before anything is installed: a refused environment is left as it was.
plan=$($PY scripts/setup_plan.py plan "$HVDEXT_MODE") || exit 2
eval "$plan"
export HVDEXT_HOROVOD_KEY HVDEXT_HOROVOD_ENV HVDEXT_HOROVOD_WANTS

# pip older than 23.3 installs editable packages through "setup.py develop", which loses --no-build-isolation.
if ! $PY -c "import sys, pip; sys.exit(int(pip.__version__.split('.')[0]) < 24)" 2>/dev/null; then
  $PY -m pip install -q --upgrade "pip>=24"
fi

if [ -n "$HVDEXT_INSTALL" ]; then
  log "installing $HVDEXT_INSTALL"
  # shellcheck disable=SC2086
  $PY -m pip install -q $HVDEXT_INSTALL
fi
if ! $PY -c "import numpy, sklearn, pytest, ruff, psutil, yaml, cloudpickle, cffi, matplotlib, tqdm, cmake, wheel,\
    mkdocs, material" 2>/dev/null
then
  log "installing the tools (requirements-tools.txt), the frameworks held at their installed versions"
  constraints=$(mktemp)
  $PY scripts/setup_plan.py constraints > "$constraints"
  $PY -m pip install -q -r requirements-tools.txt -c "$constraints"
  rm -f "$constraints"
fi

if ! lacks=$($PY scripts/setup_plan.py check-build "$HVDEXT_HOROVOD_WANTS" installed 2>/dev/null); then
  log "building Horovod 0.28.1 for ${HVDEXT_FRAMEWORKS} (${HVDEXT_HOROVOD_KEY}; installed build lacks: $lacks)"
  bash scripts/build_horovod.sh
fi

# Checked from / so that the repo root on sys.path cannot stand in for the installed package.
if ! (cd / && $PY -c "import horovod_ext, hvdext_reference, sys
sys.exit(0 if horovod_ext.__file__.startswith('$HVDEXT_ROOT/') else 1)") 2>/dev/null; then
  log "installing horovod_ext (editable)"
  $PY -m pip install -q --no-build-isolation --no-deps -e .
fi
# The native libraries are rebuilt when one is missing or older than a source (setuptools' build_ext compares
# with its own build/ folder, which the editable install above does not fill, so it is not asked unless needed).
native_stale() {
  local libs=(horovod_ext/_sizes*.so)
  [[ " $HVDEXT_FRAMEWORKS " == *" torch "* ]] && libs+=(horovod_ext/_torch_ops*.so)
  [[ " $HVDEXT_FRAMEWORKS " == *" tensorflow "* ]] && libs+=(horovod_ext/tensorflow/_tf_ops.so)
  for lib in "${libs[@]}"; do
    [ -e "$lib" ] || return 0
    [ -z "$(find cpp setup.py -newer "$lib" -print -quit)" ] || return 0
  done
  return 1
}
if native_stale; then
  log "building horovod_ext's native ops"
  $PY setup.py -q build_ext --inplace >/dev/null
fi
