"""The base of compressor specifications and the argument checks they share.

A spec is what a user passes as ``compression=``. It is usable bare (``Compression.ternary``, the defaults) or
called with arguments (``Compression.ternary(clip=3.0)`` returns a new spec); specs are immutable and hashable.
Each compressor is declared once, in its own module of horovod_ext/compressors/ (ternary.py, topk.py, gravac.py,
powersgd.py, auto/): its spec, its codec (kernels and payload sizes) and its method (its transports: the plan of a
step, plan.py); they register themselves in registry.py.
"""
import math
import numbers

SEED_LIMIT = 2 ** 64


class CompressorSpec:
    """Base of payload compressor specs: immutable settings, equality and hashing by (name, settings)."""

    name = "compressor"
    payload = True  # its payloads cannot be summed: it travels by its own method, never Horovod's allreduce
    method = None  # the plan.Method subclass that moves its gradients
    codec = None  # the plan.Codec subclass of one tensor's payload (for methods built on one)
    max_elements = None  # the largest tensor it takes (None: check_tensor's limit)
    travels = "sends a packed payload by allgather; Horovod's own DistributedOptimizer would allreduce it"
    # one rank's tensor encodes alone and any rank decodes its payload (codec.encode, codec.sent): what one rank
    # can broadcast (DiLoCo's outer="leader"); False where the encoding needs every rank (PowerSGD's factors,
    # GraVAC's ratio from the averaged gain)
    encodes_alone = True

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

    # packing="auto": what it becomes for gradients on each device (None: the spec has no packing argument)
    packing_by_device = None

    def auto_packing(self, device):
        """The packing "auto" stands for on `device` ("cpu" or "cuda")."""
        return self.packing_by_device[device]

    def for_device(self, device):
        """This spec with packing="auto" made concrete for gradients on `device` ("cpu" or "cuda"; the adapters
        call it before the settings are compared, so ranks whose gradients live on different devices get a
        SettingsMismatchError instead of payloads they cannot decode). The rule: entropy-coded packings where the
        gradient is on the host (coding is serial, and the fewest bytes), fixed ones that the CUDA kernels encode
        and decode where it is a CUDA tensor (no copy to the host and back)."""
        if self._settings.get("packing") != "auto":
            return self
        return type(self)(**dict(self._settings, packing=self.auto_packing(device)))

    def describe(self, include_seed=True):
        """A canonical string of the spec, compared across ranks (the seed excluded when it is left to rank 0)."""
        settings = dict(self._settings)
        if not include_seed:
            settings.pop("seed", None)
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(settings.items()))
        return f"{self.name}({args})"

    def __repr__(self):
        return f"Compression.{self.describe()}"

    def __eq__(self, other):
        return type(self) is type(other) and self._settings == other._settings

    def __hash__(self):
        return hash((self.name, tuple(sorted(self._settings.items()))))

    # Horovod's stock wrappers call compress()/decompress() and allreduce the result: a payload cannot survive that.
    def compress(self, tensor, *args, **kwargs):
        raise TypeError(f"Compression.{self.name} {self.travels}. Use horovod_ext's DistributedOptimizer "
                        f"(import horovod_ext.torch as hvd).")

    decompress = compress

    def payload_bytes(self, shape):
        """Bytes one rank sends for one tensor of `shape` (its dimensions, or its element count for a flat tensor)
        at a step that compresses, in this spec's wire format: each compressor's one formula of its payload's size
        (the packed formats' sizes read from the C++ core's table, sizes.py), which its codec, its method's byte
        counts, Compression.auto and the performance model (horovod_ext.perfmodel) take from here. A tensor the
        compressor sends dense instead (ternary's below min_size, PowerSGD's that do not compress) counts its
        float32 allreduce: 4 * numel. None where the size depends on the values and has no fixed bound (top-k's
        "delta" packing: counted as the step runs) or on what the run chooses (Compression.auto)."""
        raise NotImplementedError(f"Compression.{self.name} states no payload size")


def shape_and_numel(shape):
    """(shape as a tuple of ints, its element count); an element count stands for a flat tensor of that many."""
    if isinstance(shape, numbers.Integral):
        shape = (int(shape),)
    shape = tuple(int(d) for d in shape)
    return shape, math.prod(shape)


def check_resolved(spec, packing):
    """packing, where it is concrete: "auto" stands for a packing per device (CompressorSpec.for_device)."""
    if packing == "auto":
        raise ValueError(f"Compression.{spec.name}: packing='auto' has no size of its own; resolve it for the "
                         f"gradients' device first (for_device('cpu') or for_device('cuda'))")
    return packing


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


def check_bool(argument, value, allow_none=False):
    if not (isinstance(value, bool) or (allow_none and value is None)):
        allowed = "True, False or None" if allow_none else "True or False"
        raise ValueError(f"{argument} must be {allowed}, got {value!r}")
    return value


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


def element_limit(compression):
    """The check_tensor size limit of a payload compressor (top-k's indices are int32)."""
    limit = getattr(compression, "max_elements", None)
    return {} if limit is None else {"max_elements": limit}


def compression_name(compression):
    """The name statistics report for a compressor: a spec's name, a Horovod compressor class's, else its type's."""
    return getattr(compression, "name", getattr(compression, "__name__", type(compression).__name__))


def describe_compression(compression):
    """What ranks compare: a payload spec's settings (the seed only when given), or a Horovod compressor's name."""
    if isinstance(compression, CompressorSpec):
        return compression.describe(include_seed=compression.settings.get("seed") is not None)
    return getattr(compression, "__name__", type(compression).__name__)


DEVICES = ("cpu", "cuda")


def resolved_for(compression, device):
    """compression with packing="auto" made concrete for `device` (CompressorSpec.for_device); other compressors
    (Horovod's own) as they are."""
    check_choice("device", device, DEVICES)
    return compression.for_device(device) if isinstance(compression, CompressorSpec) else compression


def is_payload_compressor(compression):
    """True for compressors whose output cannot be summed (travels by allgather); False for Horovod's linear ones."""
    return isinstance(compression, CompressorSpec)
