"""Compressor specifications: the name, the arguments and their checks, one class per method.

A spec is what a user passes as ``compression=``. It is usable bare (``Compression.ternary``, the defaults) or
called with arguments (``Compression.ternary(clip=3.0)`` returns a new spec); specs are immutable and hashable.
Framework adapters turn a spec into a stateful codec (see horovod_ext/torch/ternary.py).
"""
import math
import numbers

PACKINGS = ("2bit", "base3")
TRANSPORTS = ("auto", "allgather", "two_phase")
PACKING_IDS = {"2bit": 0, "base3": 1}  # the ids the C++ core takes (hvdext::Packing)
SEED_LIMIT = 2 ** 64


class CompressorSpec:
    """Base of payload compressor specs: immutable settings, equality and hashing by (name, settings)."""

    name = "compressor"

    def __init__(self, **settings):
        self._settings = dict(settings)

    @property
    def settings(self):
        return dict(self._settings)

    def __getattr__(self, item):
        settings = self.__dict__.get("_settings", {})
        if item in settings:
            return settings[item]
        raise AttributeError(f"{type(self).__name__!s} has no attribute {item!r}")

    def __call__(self, *args, **kwargs):
        return type(self)(*args, **kwargs)

    def describe(self):
        """A canonical string of the spec, compared across ranks (the seed excluded when it is left to rank 0)."""
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self._settings.items()))
        return f"{self.name}({args})"

    def __repr__(self):
        return f"Compression.{self.describe()}"

    def __eq__(self, other):
        return type(self) is type(other) and self._settings == other._settings

    def __hash__(self):
        return hash((self.name, tuple(sorted(self._settings.items()))))

    # Horovod's stock wrappers call compress()/decompress() and allreduce the result: a payload cannot survive that.
    def compress(self, tensor, *args, **kwargs):
        raise TypeError(
            f"Compression.{self.name} sends a packed payload by allgather; Horovod's own DistributedOptimizer would "
            f"allreduce it. Use horovod_ext's DistributedOptimizer (import horovod_ext.torch as hvd)."
        )

    decompress = compress


def check_choice(argument, value, allowed):
    if value not in allowed:
        raise ValueError(f"{argument} must be one of {allowed}, got {value!r}")
    return value


def check_real(argument, value, low=None, low_open=True, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        allowed = "a finite number" + (" or None" if allow_none else "")
        raise ValueError(f"{argument} must be {allowed}, got {value!r}")
    value = float(value)
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{argument} must be {'>' if low_open else '>='} {low}, got {value!r}")
    return value


def check_int(argument, value, low=None, high=None, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{argument} must be an integer{' or None' if allow_none else ''}, got {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value >= high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"{argument} must be {bounds}, got {value!r}")
    return value


def check_bool(argument, value):
    if not isinstance(value, bool):
        raise ValueError(f"{argument} must be True or False, got {value!r}")
    return value


class Ternary(CompressorSpec):
    """TernGrad (Wen et al., NeurIPS 2017): stochastic, unbiased ternarization with a per-tensor scale.

    Each gradient g is clipped to +-clip*sigma(g), scaled by s = max|clipped g| (with ``shared_scale=True`` the max
    over ranks, one batched allreduce(Max) per step), and every element becomes s*sign(g_k) with probability
    |g_k|/s, else 0: unbiased, E[g~] = g. Codes travel packed, 4 per byte ("2bit") or 5 per byte ("base3",
    1.6 bits per element), plus the 4-byte scale, by allgather; every rank decodes and averages all payloads.

    Args:
        clip: clip gradients to clip * std(g) before ternarizing (paper: 2.5); None disables clipping.
        shared_scale: use the max of every rank's scale (TernGrad's "scaler sharing").
        packing: "base3" (1.6 bits per element) or "2bit" (2 bits, simpler to decode).
        min_size: tensors with fewer elements travel dense by allreduce (biases, norms); 0 compresses all.
        seed: key of the counter-based generator (with step, tensor, rank, element); None lets rank 0 draw one.
        transport: "allgather" (every rank receives every payload: bytes per rank grow with N), "two_phase" (needs
            shared_scale: an alltoall of code chunks, exact integer sums re-encoded at ceil(log2(2N+1)) bits, and an
            allgather of those: bytes per rank grow with log N), or "auto" (two_phase where it sends fewer bytes).
    """

    name = "ternary"
    payload = True

    def __init__(self, clip=2.5, shared_scale=False, packing="base3", min_size=1024, seed=None, transport="auto"):
        check_choice("ternary transport", transport, TRANSPORTS)
        if transport == "two_phase" and shared_scale is not True:
            raise ValueError("ternary transport='two_phase' needs shared_scale=True: it sums the codes of all ranks "
                             "as integers, which is exact only when every rank uses the same scale")
        super().__init__(
            clip=check_real("ternary clip", clip, low=0.0, allow_none=True),
            shared_scale=check_bool("ternary shared_scale", shared_scale),
            packing=check_choice("ternary packing", packing, PACKINGS),
            min_size=check_int("ternary min_size", min_size, low=0),
            seed=check_int("ternary seed", seed, low=0, high=SEED_LIMIT, allow_none=True),
            transport=transport,
        )

    @property
    def packing_id(self):
        return PACKING_IDS[self.packing]

    def describe(self, include_seed=True):
        settings = dict(self._settings)
        if not include_seed:
            settings.pop("seed")
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(settings.items()))
        return f"{self.name}({args})"


VALUE_DTYPES = ("fp16", "fp32")
VALUE_DTYPE_IDS = {"fp16": 0, "fp32": 1}  # hvdext::ValueType
POLICIES = ("exponential", "geometric")


def check_fraction(argument, value):
    value = check_real(argument, value, low=0.0)
    if value > 1.0:
        raise ValueError(f"{argument} must be in (0, 1], got {value!r}")
    return value


TOPK_MAX_ELEMENTS = 2 ** 31  # int32 indices on the wire


def k_of(numel, cf):
    """Elements top-k keeps of a tensor at compression factor cf (dense elements / kept): max(1, ceil(n / cf))."""
    return max(1, min(numel, math.ceil(numel / cf)))


def element_limit(compression):
    """The check_tensor size limit of a payload compressor (top-k's indices are int32)."""
    return {} if compression.name == "ternary" else {"max_elements": TOPK_MAX_ELEMENTS}


class TopK(CompressorSpec):
    """Layer-wise top-k by magnitude with error feedback (Stich et al. 2018; Lin et al. 2018).

    Each tensor keeps the k = max(1, ceil(ratio * n)) elements of largest |g + r| and carries the rest in its
    residual r to the next step: g_ef = g + r; sent = top_k(g_ef); r = g_ef - sent (nothing is lost, only delayed).
    The payload (int32 indices and fp16 or fp32 values, 6 or 8 bytes per kept element) travels by allgather and is
    decoded with one scatter-add of all ranks' payloads. Residuals are in the optimizer's state_dict().

    Args:
        ratio: fraction of each tensor's elements sent, in (0, 1] (0.01: compression factor 100 / 1.5 for fp16).
        error_feedback: keep the residual (recommended; without it top-k is biased).
        value_dtype: "fp16" (6 bytes per element) or "fp32" (8).
    """

    name = "topk"
    payload = True

    def __init__(self, ratio=0.01, error_feedback=True, value_dtype="fp16"):
        super().__init__(ratio=check_fraction("topk ratio", ratio),
                         error_feedback=check_bool("topk error_feedback", error_feedback),
                         value_dtype=check_choice("topk value_dtype", value_dtype, VALUE_DTYPES))


class AdaptiveTopK(CompressorSpec):
    """GraVAC (Tyagi & Swany, "GraVAC: Adaptive Compression for Communication-Efficient Distributed DL Training",
    IEEE CLOUD 2023), Algorithm 1: top-k with error feedback whose compression factor CF (dense size / sent size)
    moves during training, driven by the measured compression gain. See horovod_ext.compression.gravac for the
    controller, its math and its tuning guide.

    Args:
        min_cf, max_cf: the range of CF (>= 1, min_cf <= max_cf).
        epsilon: the smallest compression gain, sqrt(EWMA(|C(g_ef)|^2) / EWMA(|g_ef|^2)), a CF may have; in (0, 1].
        window: steps between CF moves (>= 1).
        omega: relative tolerance: raise theta_min when gain_min and gain_candidate are within omega, and settle on
            the lower of the two CFs whose compression throughputs are highest when those are within omega; [0, 1).
        policy: how the candidate's scale-up moves each window: "exponential" (theta_s squared: CF 10, 20, 40, 160,
            1000 from min_cf 10) or "geometric" (doubled).

    Defaults. epsilon 0.7 is the lower of the two values the paper reports (0.7, 0.9; the authors' code: 0.75):
    with error feedback, top-k at CF 10 keeps a gain of 0.74-0.86 on the digits MLP and CNN and about 0.7 on a
    small LSTM, and every one of them trains at CF 10 as well as dense, so a higher epsilon sends dense what
    compresses without loss (at 0.9 every step of the digits MLP went dense). omega 0.05 is the authors' code's.
    window 500 steps is ten EWMA time constants (1 / a) at 2 ranks (a = N / 100), so each candidate is judged on settled
    gains and throughputs. The choice and its measurements: benchmarks/gravac.py.
    """

    name = "adaptive_topk"
    payload = True

    def __init__(self, min_cf=10, max_cf=1000, epsilon=0.7, window=500, omega=0.05, policy="exponential"):
        min_cf = check_real("adaptive_topk min_cf", min_cf, low=1.0, low_open=False)
        max_cf = check_real("adaptive_topk max_cf", max_cf, low=1.0, low_open=False)
        if min_cf > max_cf:
            raise ValueError(f"adaptive_topk min_cf must be <= max_cf, got min_cf={min_cf!r} > max_cf={max_cf!r}")
        omega = check_real("adaptive_topk omega", omega, low=0.0, low_open=False)
        if omega >= 1.0:
            raise ValueError(f"adaptive_topk omega must be in [0, 1), got {omega!r}")
        super().__init__(min_cf=min_cf, max_cf=max_cf, epsilon=check_fraction("adaptive_topk epsilon", epsilon),
                         window=check_int("adaptive_topk window", window, low=1), omega=omega,
                         policy=check_choice("adaptive_topk policy", policy, POLICIES))

    value_dtype = "fp16"
    error_feedback = True


FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
MAX_ELEMENTS = 2 ** 34  # the random key counts 4-element blocks in 32 bits


def check_tensor(what, name, dtype_name, numel, shape, max_elements=MAX_ELEMENTS):
    """The checks every framework applies to a tensor a payload compressor takes, with errors that name the
    tensor and the allowed values (deterministic, so every rank raises the same one)."""
    if dtype_name not in FLOAT_DTYPES:
        raise TypeError(f"{what}: tensor {name!r} has dtype {dtype_name}; allowed dtypes are {', '.join(FLOAT_DTYPES)}")
    if numel == 0:
        raise ValueError(f"{what}: tensor {name!r} is empty (shape {tuple(shape)}); "
                         f"compressed tensors must hold at least 1 element")
    if numel >= max_elements:
        raise ValueError(f"{what}: tensor {name!r} has {numel} elements; fewer than {max_elements} are supported")


def describe_compression(compression):
    """What ranks compare: a payload spec's settings (the seed only when given), or a Horovod compressor's name."""
    if isinstance(compression, CompressorSpec):
        seed = compression.settings.get("seed")
        return compression.describe(include_seed=seed is not None) if hasattr(compression, "packing_id") \
            else compression.describe()
    return getattr(compression, "__name__", type(compression).__name__)


def is_payload_compressor(compression):
    """True for compressors whose output cannot be summed (travels by allgather); False for Horovod's linear ones."""
    return isinstance(compression, CompressorSpec)


def payload_compressors():
    """The compressors both frameworks add to Horovod's Compression (none, fp16), bare, under their names."""
    return {"ternary": Ternary(), "topk": TopK(), "adaptive_topk": AdaptiveTopK()}
