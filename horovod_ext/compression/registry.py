"""The registry of payload compressors: the one place that lists them. Each is declared in its own module (its spec
names its method and codec); both frameworks' ``hvd.Compression`` expose every registered compressor under its name,
and both adapters build a compressor's plan from its spec alone (``method_for``), never by testing its name.

A compressor defined elsewhere (a user's, a test's) joins with ``register(MySpec())``: its spec subclasses
CompressorSpec and names a Method (plan.Allgather for a codec by allgather) and a Codec whose kernels the backends
run (native kernels from the backend's table, or NumPy functions through ``backend.numpy``).
"""
from .auto import Auto
from .plan import Linear
from .powersgd import PowerSGD
from .specs import CompressorSpec
from .ternary import Ternary
from .gravac import AdaptiveTopK
from .topk import TopK

_compressors = {}
_namespaces = []


def register(spec):
    """Add a compressor (its spec with default arguments) under spec.name, also to every hvd.Compression made so
    far and later."""
    if not isinstance(spec, CompressorSpec) or spec.method is None:
        raise TypeError(f"register() takes a CompressorSpec whose class names its method, got {spec!r}")
    _compressors[spec.name] = spec
    for namespace in _namespaces:
        setattr(namespace, spec.name, spec)
    return spec


def payload_compressors():
    """{name: spec with its defaults} of every registered payload compressor."""
    return dict(_compressors)


def expose(namespace):
    """Make every registered compressor (and every later one) an attribute of a framework's Compression class."""
    _namespaces.append(namespace)
    for name, spec in _compressors.items():
        setattr(namespace, name, spec)
    return namespace


def method_for(compression):
    """The plan.Method class that moves gradients compressed with `compression` (a spec, or Horovod's linear
    compressors, which go by allreduce)."""
    return compression.method if isinstance(compression, CompressorSpec) else Linear


for _spec in (Ternary(), TopK(), AdaptiveTopK(), PowerSGD(), Auto()):
    register(_spec)
