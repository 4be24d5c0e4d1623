#!/usr/bin/env bash
# Builds and installs Horovod 0.28.1 with Gloo for PyTorch and TensorFlow into the active Python.
#
# Horovod's last release does not build against torch >= 2.1 or TensorFlow 2.21 as it is. This script
# downloads the sdist and makes three edits to it (see ../shared/FACTS.md), then builds a wheel:
#   - CMakeLists.txt and horovod/torch/CMakeLists.txt ask for C++14; torch >= 2.1 headers need C++17.
#   - horovod/tensorflow/xla_mpi_ops.cc (the optional XLA lowering of Horovod's ops) includes an XLA header
#     that tensorflow-cpu 2.21 does not ship; it is left out of TF_SOURCES.
# The wheel is kept in $HVDEXT_CACHE (default ~/.cache/horovod-ext), keyed by the torch and TF versions,
# so a later set-up on the same machine installs it without compiling.
set -euo pipefail
PY=${PY:-python}
VERSION=0.28.1
CACHE=${HVDEXT_CACHE:-$HOME/.cache/horovod-ext}
KEY=$($PY -c "import torch, tensorflow as tf; print(f'torch{torch.__version__}-tf{tf.__version__}'.replace('+', '_'))" 2>/dev/null)
WHEELS="$CACHE/horovod-$VERSION-$KEY"
mkdir -p "$WHEELS"

if ! ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1; then
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  $PY -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$WORK"
  tar -xzf "$WORK/horovod-$VERSION.tar.gz" -C "$WORK"
  SRC="$WORK/horovod-$VERSION"

  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
  sed -i '/horovod\/tensorflow\/xla_mpi_ops.cc/d' "$SRC/horovod/tensorflow/CMakeLists.txt"
  # Fail loudly if an edit did not apply (a different sdist would silently build the wrong thing).
  ! grep -q "CMAKE_CXX_STANDARD 14" "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
  ! grep -q "xla_mpi_ops.cc" "$SRC/horovod/tensorflow/CMakeLists.txt"

  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
         HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO
  export MAKEFLAGS="-j$(nproc)"
  $PY -m pip wheel -q --no-build-isolation --no-deps "$SRC" -w "$WHEELS"
fi
$PY -m pip install -q --no-deps --force-reinstall "$WHEELS"/horovod-*.whl
report=$(TF_CPP_MIN_LOG_LEVEL=3 horovodrun --check-build 2>/dev/null)
echo "$report"
for need in "[X] PyTorch" "[X] TensorFlow" "[X] Gloo"; do
  [[ "$report" == *"$need"* ]] || { echo "horovodrun --check-build lacks $need" >&2; exit 1; }
done
