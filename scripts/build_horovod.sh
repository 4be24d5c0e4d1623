#!/usr/bin/env bash
# Builds and installs Horovod 0.28.1 into the active Python, for the frameworks and with the collectives that
# scripts/setup_plan.py chose (HVDEXT_HOROVOD_ENV: Gloo always, MPI where OpenMPI is found, NCCL for GPU operations
# where torch is a CUDA build and NCCL is found; PyTorch and/or TensorFlow as installed). Run by setup.sh; run alone,
# it asks setup_plan.py itself (the active environment's frameworks).
#
# Horovod's last release does not build against torch >= 2.1 or TensorFlow 2.21 as it is. This script
# downloads the sdist and edits it (each edit below, with why; setup_plan.py's SOURCE_EDITS names the revision of
# these edits in the wheel cache's key), then builds a wheel:
#   - CMakeLists.txt and horovod/torch/CMakeLists.txt ask for C++14; torch >= 2.1 headers need C++17.
#   - horovod/tensorflow/xla_mpi_ops.cc (the optional XLA lowering of Horovod's ops) includes an XLA header
#     that tensorflow-cpu 2.21 does not ship; it is left out of TF_SOURCES.
#   - horovod/torch/mpi_ops_v2.cc: the torch collectives' enqueue functions (DoAllreduce, DoAllgather, ...) run
#     without the GIL (pybind11's call_guard). Horovod's background thread, finalizing after a peer's death in
#     elastic mode, holds the process-set table's mutex while it releases queued torch tensors, which needs the
#     GIL; an enqueue that held the GIL while it waited for that mutex deadlocked the rank (docs/elastic.md).
#   - horovod/common/tensor_queue.*, operations.cc: a tensor queue refuses entries (Horovod's shut-down error) from
#     the moment the background thread finalizes it, after a peer's death, until Horovod is initialized again.
#     The enqueue functions test Horovod's shut_down flag before they take the queue's mutex, so an entry added
#     between the flag and the finalization was never called back: its rank waited on it for ever (a torch handle
#     in synchronize, a TensorFlow op, which holds up its whole step), and its name stayed in the queue.
#   - CMakeLists.txt builds RelWithDebInfo: -O3 and -g. The -g is dropped: debug information is most of each
#     library's size and about a third of its compile time (benchmarks/RESULTS.md); the code is the same -O3.
#   - horovod/torch/handle_manager.*, mpi_ops_v2.cc: hvd.synchronize (WaitAndClear) waited for a handle in a loop of
#     sched_yield calls, taking the GIL again between them, so a waiting rank kept a core busy: on a host with fewer
#     cores than ranks (or beside data-loader workers) it took the CPU the background thread, Gloo and the other
#     ranks needed. It now blocks on a condition variable that MarkDone (and Reset) signals, without the GIL.
#   - horovod/common/util.py: the launcher's build checks (horovodrun asks whether Gloo, MPI or NCCL was built, in a
#     forked process that imports one framework's Horovod extension) ask PyTorch's extension before TensorFlow's.
#     Both extensions come from one CMake configuration, so either answers; importing TensorFlow takes seconds
#     longer than PyTorch, and every horovodrun (and horovodrun_elastic) launch waited for it.
# The wheel is kept in $HVDEXT_CACHE (default ~/.cache/horovod-ext) under HVDEXT_HOROVOD_KEY (framework versions and
# build choices), so a later set-up on the same machine with the same choices installs it without compiling.
# HVDEXT_HOROVOD_SDIST names a horovod-0.28.1.tar.gz already on disk (a cluster without a package index).
# HVDEXT_HOROVOD_TARGET installs into that folder (pip --target) instead of the active Python, for a second build
# beside the first (scripts/gpu_checks.sh: one without NCCL); use it with PYTHONPATH=$HVDEXT_HOROVOD_TARGET.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY=${PY:-python}
VERSION=0.28.1
CACHE=${HVDEXT_CACHE:-$HOME/.cache/horovod-ext}
if [ -z "${HVDEXT_HOROVOD_KEY:-}" ]; then
  eval "$($PY "$HERE/setup_plan.py" plan active)"
fi
WHEELS="$CACHE/$HVDEXT_HOROVOD_KEY"
mkdir -p "$WHEELS"

if ! ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1; then
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  if [ -n "${HVDEXT_HOROVOD_SDIST:-}" ]; then
    cp "$HVDEXT_HOROVOD_SDIST" "$WORK/horovod-$VERSION.tar.gz"
  else
    $PY -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$WORK"
  fi
  tar -xzf "$WORK/horovod-$VERSION.tar.gz" -C "$WORK"
  SRC="$WORK/horovod-$VERSION"

  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
  sed -i '/horovod\/tensorflow\/xla_mpi_ops.cc/d' "$SRC/horovod/tensorflow/CMakeLists.txt"
  sed -i 's/string(REPLACE "-O2" "-O3" \(CMAKE_[A-Z]*_FLAGS_RELWITHDEBINFO\)/string(REPLACE "-O2 -g" "-O3" \1/' "$SRC/CMakeLists.txt"
  $PY - "$SRC/horovod/torch/mpi_ops_v2.cc" <<'PATCH'
import re, sys
path = sys.argv[1]
source = open(path).read()
edited, count = re.subn(r'(m\.def\("[A-Za-z0-9_]+",\s*&Do[A-Za-z]+)\);',
                        r'\1, py::call_guard<py::gil_scoped_release>());', source)
if count != 158:  # Horovod 0.28.1's enqueue bindings
    sys.exit(f"build_horovod.sh: {path} is not Horovod 0.28.1's ({count} enqueue bindings found, 158 expected)")
open(path, "w").write(edited)
PATCH
  $PY - "$SRC/horovod" <<'PATCH'
import os, sys
horovod = sys.argv[1]


def edit(name, pairs):
    path = os.path.join(horovod, name)
    source = open(path).read()
    for old, new in pairs:
        if source.count(old) != 1:
            sys.exit(f"build_horovod.sh: {path} is not Horovod 0.28.1's (no single {old.splitlines()[0]!r})")
        source = source.replace(old, new)
    open(path, "w").write(source)


LOCK = "  std::lock_guard<std::mutex> guard(mutex_);\n"
REFUSE = LOCK + "  if (finalized_) {\n    return SHUT_DOWN_ERROR;\n  }\n"
edit("common/tensor_queue.h", [
    ("  void FinalizeTensorQueue(const Status& status);\n",
     "  void FinalizeTensorQueue(const Status& status);\n\n  void Reopen();\n"),
    ("  mutable std::mutex mutex_;\n",
     "  mutable std::mutex mutex_;\n\n  // Set by FinalizeTensorQueue, cleared by Reopen: an entry added in between would never be called back.\n"
     "  bool finalized_ = false;\n")])
edit("common/tensor_queue.cc", [
    ("Status TensorQueue::AddToTensorQueue(TensorTableEntry& e, Request& message) {\n" + LOCK,
     "Status TensorQueue::AddToTensorQueue(TensorTableEntry& e, Request& message) {\n" + REFUSE),
    ("                                          std::vector<Request>& messages) {\n" + LOCK,
     "                                          std::vector<Request>& messages) {\n" + REFUSE),
    ("void TensorQueue::FinalizeTensorQueue(const Status& status) {\n" + LOCK,
     "void TensorQueue::FinalizeTensorQueue(const Status& status) {\n" + LOCK + "  finalized_ = true;\n"),
    ("// Execute callback for each tensor and clear tensor queue\n",
     "void TensorQueue::Reopen() {\n" + LOCK + "  finalized_ = false;\n}\n\n"
     "// Execute callback for each tensor and clear tensor queue\n")])
edit("common/util.py", [
    ("EXTENSIONS = ['tensorflow', 'torch', 'mxnet']\n", "EXTENSIONS = ['torch', 'tensorflow', 'mxnet']\n")])
edit("torch/handle_manager.h", [
    ("#include <atomic>\n", "#include <atomic>\n#include <condition_variable>\n"),
    ("  bool PollHandle(int handle);\n",
     "  bool PollHandle(int handle);\n  // Blocks until MarkDone(handle) or Reset(); an unknown handle throws as in PollHandle.\n"
     "  void WaitHandle(int handle);\n"),
    ("  std::mutex mutex_;\n", "  std::mutex mutex_;\n  std::condition_variable done_;\n")])
UNKNOWN = ('      throw std::invalid_argument("Handle " + std::to_string(handle) +\n'
           '                                  " was not created or has been cleared.");\n')
edit("torch/handle_manager.cc", [
    ("  results_[handle] = std::make_shared<Status>(status);\n}\n",
     "  results_[handle] = std::make_shared<Status>(status);\n  done_.notify_all();\n}\n"),
    ("std::shared_ptr<Status> HandleManager::ReleaseHandle(int handle) {\n",
     "void HandleManager::WaitHandle(int handle) {\n  std::unique_lock<std::mutex> lock(mutex_);\n"
     "  done_.wait(lock, [&] {\n    auto entry = results_.find(handle);\n    if (entry == results_.end()) {\n"
     + UNKNOWN + "    }\n    return entry->second != nullptr;\n  });\n}\n\n"
     "std::shared_ptr<Status> HandleManager::ReleaseHandle(int handle) {\n"),
    ("  results_.clear();\n  last_handle_ = 0;\n", "  results_.clear();\n  last_handle_ = 0;\n  done_.notify_all();\n")])
edit("torch/mpi_ops_v2.cc", [
    ("  while (true) {\n    if (handle_manager.PollHandle(handle)) break;\n    {\n"
     "      py::gil_scoped_release release_python_gil;\n      std::this_thread::yield();\n    }\n  }\n",
     "  {\n    py::gil_scoped_release release_python_gil;\n    handle_manager.WaitHandle(handle);\n  }\n")])
edit("common/operations.cc", [
    ("  // Signal that initialization is completed.\n  state.initialization_done = true;\n",
     "  // Signal that initialization is completed.\n  state.process_set_table.Get(0).tensor_queue.Reopen();\n"
     "  state.initialization_done = true;\n")])
PATCH
  # Fail loudly if an edit did not apply (a different sdist would silently build the wrong thing).
  ! grep -q "CMAKE_CXX_STANDARD 14" "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
  ! grep -q "xla_mpi_ops.cc" "$SRC/horovod/tensorflow/CMakeLists.txt"
  [ "$(grep -c 'string(REPLACE "-O2 -g" "-O3" CMAKE_' "$SRC/CMakeLists.txt")" = 3 ]

  # shellcheck disable=SC2086
  export $HVDEXT_HOROVOD_ENV
  if [ -n "${HVDEXT_NCCL_LIBRARY:-}" ]; then
    # Horovod's FindNCCL looks for libnccl.so; the nvidia-nccl wheel ships libnccl.so.2 only.
    mkdir -p "$WORK/nccl/lib"
    ln -s "$HVDEXT_NCCL_HOME/include" "$WORK/nccl/include"
    ln -s "$HVDEXT_NCCL_LIBRARY" "$WORK/nccl/lib/libnccl.so"
    export HOROVOD_NCCL_HOME="$WORK/nccl" PATH="$HOROVOD_CUDA_HOME/bin:$PATH"
  fi
  export MAKEFLAGS="-j$(nproc)"
  # GCC >= 13 no longer includes <string>, <stdexcept> and <cstdint> through other standard headers, and Horovod's
  # sources rely on that (group_table.h's std::string, common.h's std::logic_error).
  export CXXFLAGS="${CXXFLAGS:-} -include cstdint -include string -include stdexcept"
  # Gloo's and flatbuffers' CMakeLists ask for CMake 2.8, which CMake >= 4 refuses unless told a policy floor.
  export CMAKE_POLICY_VERSION_MINIMUM=${CMAKE_POLICY_VERSION_MINIMUM:-3.5}
  echo "[setup] Horovod $VERSION build: $HVDEXT_HOROVOD_ENV" >&2
  $PY -m pip wheel -q --no-build-isolation --no-deps "$SRC" -w "$WHEELS"
fi
if [ -n "${HVDEXT_HOROVOD_TARGET:-}" ]; then
  $PY -m pip install -q --no-deps --upgrade --target "$HVDEXT_HOROVOD_TARGET" "$WHEELS"/horovod-*.whl
  export PYTHONPATH="$HVDEXT_HOROVOD_TARGET${PYTHONPATH:+:$PYTHONPATH}"
else
  $PY -m pip install -q --no-deps --force-reinstall "$WHEELS"/horovod-*.whl
fi
# setup_plan.py's check-build reads this: a Horovod built with an earlier revision of the edits is built again.
echo "$HVDEXT_HOROVOD_KEY" > "$($PY -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("horovod").origin))')/horovod_ext_build"
report=$(TF_CPP_MIN_LOG_LEVEL=3 $PY -c 'from horovod.runner.launch import run_commandline; run_commandline()' \
         --check-build 2>/dev/null)
echo "$report"
if ! lacks=$(echo "$report" | $PY "$HERE/setup_plan.py" check-build "$HVDEXT_HOROVOD_WANTS"); then
  echo "horovodrun --check-build lacks $lacks" >&2
  exit 1
fi
