"""Payload sizes, read from the C++ core (horovod_ext._sizes, built from cpp/python/sizes.cpp over cpp/include):
the one place each wire format's size is defined, used by both frameworks' byte accounting and by the plans."""
try:
    from horovod_ext import _sizes
except ImportError as exc:  # pragma: no cover - a build step is missing
    raise ImportError("horovod_ext._sizes is missing: build the native ops with `python setup.py build_ext --inplace` "
                      "(scripts/setup.sh does it)") from exc

PACKING_IDS = {"2bit": 0, "base3": 1, "entropy": 2}  # ternary packings as the C++ core numbers them (hvdext::Packing)

ternary_payload_bytes = _sizes.ternary_payload_bytes  # (n, packing id): the float32 scale + packed codes
ternary_packed_bytes = _sizes.ternary_packed_bytes  # (n, packing id): n packed codes
topk_payload_bytes = _sizes.topk_payload_bytes  # (k, value type id): k int32 indices + k values
two_phase_level_bits = _sizes.two_phase_level_bits  # (nranks): ceil(log2(2N + 1))
two_phase_stream_bytes = _sizes.two_phase_stream_bytes  # (count, bits)
