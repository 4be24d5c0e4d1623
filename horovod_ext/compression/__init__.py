"""Framework-free parts shared by the PyTorch and TensorFlow adapters: compressor specs and their argument checks,
wire-byte accounting, compression statistics and the cross-rank settings check."""
from .specs import CompressorSpec, Ternary, is_payload_compressor
from .stats import CompressionStats
from .consistency import SettingsMismatchError, settings_mismatch_message

__all__ = ["CompressorSpec", "Ternary", "is_payload_compressor", "CompressionStats",
           "SettingsMismatchError", "settings_mismatch_message"]
