"""The layers that must not import Horovod (docs/internals.md, "Layout"): the framework-free core (compression/,
compressors/, consensus/, perfmodel/) and torch_common/ (what horovod_ext.torch and torch.distributed's adapter
share), imported and used in a process where importing Horovod fails."""
import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
HIDE_HOROVOD = f"""
import sys
sys.path.insert(0, {TESTS!r})
import hide_horovod
hide_horovod.hide()
"""

USE = """
import torch
import horovod_ext.compression, horovod_ext.compressors, horovod_ext.consensus, horovod_ext.perfmodel
from horovod_ext.compressors import BUILTINS
from horovod_ext.torch_common.kernels import TorchKernels
from horovod_ext.torch_common.tensors import TorchTensors
import horovod_ext.torch_common.parameter_sync, horovod_ext.torch_common.diloco
import horovod_ext.ddp.leader, horovod_ext.ddp.diloco, horovod_ext.ddp.collectives
r = torch.zeros(3)
g_ef, norm2 = TorchKernels.ef_accumulate(torch.tensor([1.0, 2.0, 2.0]), r)
assert g_ef is r and r.tolist() == [1.0, 2.0, 2.0] and float(norm2) == 9.0, (r, norm2)
assert "ternary" in [spec.name for spec in BUILTINS]
try:
    import horovod_ext.torch
except ImportError as error:
    assert "hidden" in str(error), error
else:
    raise AssertionError("horovod was not hidden")
print("ok")
"""


def test_the_core_and_torch_common_import_and_run_without_horovod():
    done = subprocess.run([sys.executable, "-c", HIDE_HOROVOD + USE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
