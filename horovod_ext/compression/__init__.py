"""Framework-free parts shared by the PyTorch and TensorFlow adapters: compressor specs and their argument checks,
each compressor declared once (ternary.py, topk.py, gravac.py, powersgd.py) and registered (registry.py), the
per-step communication plan (plan.py), error feedback, a training run's lifecycle (lifecycle.py), wire-byte
accounting, compression statistics and the cross-rank settings check."""
from .specs import CompressorSpec, is_payload_compressor
from .ternary import Ternary
from .stats import CompressionStats
from .consistency import SettingsMismatchError, settings_mismatch_message
from .registry import method_for, payload_compressors, register

__all__ = ["CompressorSpec", "Ternary", "is_payload_compressor", "CompressionStats", "SettingsMismatchError",
           "settings_mismatch_message", "method_for", "payload_compressors", "register"]
