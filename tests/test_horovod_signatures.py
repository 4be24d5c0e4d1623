"""Every argument of Horovod 0.28.1's public optimizer, tape, function and callback signatures exists in
horovod_ext's, at the same position (so positional calls bind the same), with the same default where the default
is a plain value. Fails when Horovod has an argument ours lacks.

The signatures are read in a subprocess: importing horovod.tensorflow into a process that has already run
horovod_ext.torch's ternary kernels on non-float32 tensors changes their results (seen on 2026-11-23, under
investigation), so no test imports both frameworks into the pytest process."""
import inspect
import json
import subprocess
import sys

import pytest

LITERALS = (int, float, bool, str, type(None))
# defaults that differ only in spelling: None in ours means Horovod's default object (Compression.none, Average)
SAME_MEANING = {"compression", "op"}


def pairs():
    import horovod.tensorflow as htf
    import horovod.tensorflow.keras as hkeras
    import horovod.torch as htorch
    from horovod.tensorflow.keras import callbacks as hcallbacks

    import horovod_ext.tensorflow as etf
    import horovod_ext.tensorflow.keras as ekeras
    import horovod_ext.torch as etorch

    yield "torch.DistributedOptimizer", htorch.DistributedOptimizer, etorch.DistributedOptimizer
    yield "torch.broadcast_optimizer_state", htorch.broadcast_optimizer_state, etorch.broadcast_optimizer_state
    yield "tensorflow.DistributedGradientTape", htf.DistributedGradientTape, etf.DistributedGradientTape.__init__
    yield "keras.DistributedOptimizer", hkeras.DistributedOptimizer, ekeras.DistributedOptimizer
    for name in ("BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
                 "LearningRateScheduleCallback", "BestModelCheckpoint"):
        yield f"keras.callbacks.{name}", getattr(hcallbacks, name).__init__, getattr(ekeras.callbacks, name).__init__


def parameters(fn):
    """[(name, default)] with the default as itself when a plain value, else "<object>" (or "<none>": no default)."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self":
            continue
        default = "<none>" if p.default is inspect.Parameter.empty else \
            (p.default if isinstance(p.default, LITERALS) else "<object>")
        out.append((p.name, default))
    return out


def read_signatures():
    """Run in a subprocess: {what: [horovod's parameters, ours]}."""
    print(json.dumps({what: [parameters(h), parameters(o)] for what, h, o in pairs()}))


@pytest.fixture(scope="module")
def signatures():
    code = f"import sys; sys.path.insert(0, {__file__.rsplit('/', 1)[0]!r}); " \
           "import test_horovod_signatures as t; t.read_signatures()"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", **__import__("os").environ})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


WHAT = ["torch.DistributedOptimizer", "torch.broadcast_optimizer_state", "tensorflow.DistributedGradientTape",
        "keras.DistributedOptimizer"] + [f"keras.callbacks.{n}" for n in (
            "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
            "LearningRateScheduleCallback", "BestModelCheckpoint")]


@pytest.mark.parametrize("what", WHAT)
def test_signature_has_every_horovod_argument(signatures, what):
    theirs, mine = signatures[what]
    names = [name for name, _ in mine]
    missing = [name for name, _ in theirs if name not in names]
    assert not missing, f"{what} lacks Horovod's arguments {missing}"
    for position, (name, default) in enumerate(theirs):
        assert names[position] == name, f"{what}: Horovod's argument {name!r} is at position {position}, ours " \
                                        f"has {names[position]!r} there"
        if name not in SAME_MEANING and default not in ("<object>", "<none>"):
            assert mine[position][1] == default, \
                f"{what}({name}=...): Horovod's default {default!r}, ours {mine[position][1]!r}"


def test_every_pair_is_read(signatures):
    assert sorted(signatures) == sorted(WHAT)


def test_torch_optimizer_offers_horovods_attributes():
    import torch

    import horovod_ext.torch as hvd

    hvd.init()
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    assert sorted(opt._parameter_names.values()) == ["bias", "weight"]
    assert type(opt).__module__ == "horovod.torch.optimizer"  # how Horovod's own functions recognize it
    for method in ("synchronize", "skip_synchronize", "step", "zero_grad", "state_dict", "load_state_dict"):
        assert callable(getattr(opt, method))


def test_horovod_private_api_is_checked_against_its_version():
    """Horovod's private API is used in one module (horovod_ext/horovod_internals.py), which names the versions it
    was read from; another Horovod fails there with a clear error, not inside a step."""
    import pathlib

    from horovod_ext import horovod_internals

    assert horovod_internals.check_version() in horovod_internals.KNOWN_VERSIONS
    with pytest.raises(RuntimeError, match=r"Horovod 0\.29\.0 is installed; install horovod==0\.28\.1"):
        horovod_internals.check_version("0.29.0")
    package = pathlib.Path(horovod_internals.__file__).parent
    private = ("._basics", "process_sets._", "_temp_process_set_object", "_init_process_sets")
    users = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                   if any(name in p.read_text() for name in private))
    assert users == ["horovod_internals.py"], users
