"""The registry of payload compressors: where every compressor is looked up. Each is declared in its own module (its
spec names its method and codec); both frameworks' ``hvd.Compression`` expose every registered compressor under its
name, and both adapters build a compressor's plan from its spec alone (``method_for``), never by testing its name.

The built-in compressors (horovod_ext/compressors/) register themselves when that package is imported, in the order
its ``BUILTINS`` lists them; this package's ``__init__`` imports it, so the registry is complete wherever it is
consulted. A compressor defined elsewhere (a user's, a test's) joins with ``register(MySpec())``: its spec subclasses
CompressorSpec and names a Method (plan.Allgather for a codec by allgather) and a Codec whose kernels the backends
run (native kernels from the backend's table, or NumPy functions through ``backend.numpy``).
"""
from .plan import Linear
from .specs import CompressorSpec

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

