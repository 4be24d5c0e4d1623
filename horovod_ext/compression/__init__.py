"""The shared step core, framework-free, which the PyTorch and TensorFlow adapters and every compressor run on: the
base of compressor specs and their argument checks (specs.py), the registry (registry.py), the per-step
communication plan and the Method / Codec bases (plan.py), error feedback as a codec wrapper (feedback.py), the step
driver (driver.py) and a step's context (context.py), the backend contract (backend.py), a training run's lifecycle
(lifecycle.py: agreement, seed, checkpoints through resume.py, elastic resets through generation.py), the join check
(join.py), payload sizes from the C++ core (sizes.py), wire-byte accounting (wire.py), compression statistics
(stats.py), the cross-rank settings check (consistency.py) and Horovod's own arguments (horovod_args.py).

The compressors themselves (each method in one module) are horovod_ext.compressors; importing this package imports
that one last, so that the built-in compressors are registered wherever the registry is consulted.
"""
from .specs import CompressorSpec, is_payload_compressor
from .stats import CompressionStats
from .consistency import SettingsMismatchError, settings_mismatch_message
from .registry import method_for, payload_compressors, register

from horovod_ext import compressors as _compressors  # noqa: E402,F401  (registers the built-in compressors)

__all__ = ["CompressorSpec", "is_payload_compressor", "CompressionStats", "SettingsMismatchError",
           "settings_mismatch_message", "method_for", "payload_compressors", "register"]
