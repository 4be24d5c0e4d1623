"""The backend contract (horovod_ext/compression/backend.py): the three backends implement every primitive, and every
primitive, and every method of the step context over it (compression/context.py), behaves as the contract says on
PyTorch over Horovod, PyTorch over torch.distributed (horovod_ext.ddp, under torchrun with Horovod hidden),
TensorFlow eager and TensorFlow inside tf.function (tests/contract_cases.py, run by tests/workers/contract_worker.py
at 2 ranks)."""
import inspect

import pytest

from contract_cases import CASES, CONTEXT_CASES
from horovod_ext.compression.backend import Backend
from horovod_ext.compression.context import StepContext
from hvdrun import horovodrun, torchrun

PRIMITIVES = sorted(Backend.__abstractmethods__)
# the step context's methods a method's step calls (use: which backend; nranks: the backend's)
CONTEXT = sorted(name for name, value in vars(StepContext).items()
                 if callable(value) and not name.startswith("_") and name != "use")


def test_every_primitive_has_a_conformance_case():
    assert sorted(CASES) == PRIMITIVES


def test_every_method_of_the_step_context_has_a_conformance_case():
    assert sorted(CONTEXT_CASES) == CONTEXT


def test_the_contract_is_abstract_so_a_missing_primitive_fails_at_construction():
    class Partial(Backend):
        def flat32(self, g):
            return g

    with pytest.raises(TypeError, match="abstract"):
        Partial()


def test_both_backends_implement_the_contract_with_its_signatures():
    from horovod_ext.ddp.backend import DDPBackend
    from horovod_ext.tensorflow.backend import TFBackend
    from horovod_ext.torch.backend import TorchBackend

    for backend in (TorchBackend, TFBackend, DDPBackend):
        assert issubclass(backend, Backend) and not backend.__abstractmethods__, backend
        for name in PRIMITIVES:
            want = inspect.signature(getattr(Backend, name))
            got = inspect.signature(getattr(backend, name))
            # static methods drop self; every other parameter is the contract's
            wanted = [p for p in want.parameters if p != "self"]
            have = [p for p in got.parameters if p != "self"]
            assert have == wanted, (backend.__name__, name, have, wanted)


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_every_primitive_conforms(framework):
    results, _ = horovodrun(2, "tests/workers/contract_worker.py", framework, timeout=300)
    for r in results:
        for mode, cases in r["results"].items():
            assert sorted(cases) == sorted(PRIMITIVES + [f"context.{name}" for name in CONTEXT]), mode
            failures = {case: detail for case, detail in cases.items() if detail is not None}
            assert not failures, (r["rank"], mode, failures)


def test_every_primitive_conforms_over_torch_distributed_without_horovod():
    """horovod_ext.ddp's backend under torchrun (Gloo), in processes where importing Horovod fails."""
    results, _ = torchrun(2, "tests/workers/contract_worker.py", "ddp", timeout=300)
    for r in results:
        cases = r["results"]["ddp"]
        assert sorted(cases) == sorted(PRIMITIVES + [f"context.{name}" for name in CONTEXT])
        failures = {case: detail for case, detail in cases.items() if detail is not None}
        assert not failures, (r["rank"], failures)
