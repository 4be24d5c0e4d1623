"""The digits examples' runs that several tests read, one launch each (issue 48's suite time): at 2 ranks, seed 42 and
the examples' 30 epochs, one launch of examples/pytorch_digits.py (and one of examples/keras_digits.py) trains
data-parallel SGD with every compressor the accuracy tests check and every parameter-space optimizer, each run from
the same initial weights and data order as the others. tests/test_torch_multiprocess.py, tests/test_tensorflow.py
and tests/test_leader.py read the same results."""
import functools
import json
import os
import tempfile

from hvdrun import horovodrun

OPTIMIZERS = ["dp", "lsgd", "async_lsgd", "easgd", "async_easgd"]
COMPRESSIONS = {"examples/pytorch_digits.py": ["none", "ternary", "powersgd", "topk", "adaptive_topk"],
                "examples/keras_digits.py": ["none", "ternary", "topk", "adaptive_topk", "powersgd"]}


@functools.lru_cache(maxsize=None)
def digits_at_two_ranks(example):
    """{run name (the compression for "dp", else the optimizer): that run's result} of one launch; keras_digits.py
    also checks after every epoch that the data-parallel runs' weights are identical on both ranks."""
    out = os.path.join(tempfile.mkdtemp(prefix="hvdext-digits-"), "digits.json")
    extra = ["--check-identical"] if "keras" in example else []
    runs = len(OPTIMIZERS) - 1 + len(COMPRESSIONS[example])
    horovodrun(2, example, "--optimizer", ",".join(OPTIMIZERS), "--compression", ",".join(COMPRESSIONS[example]),
               *extra, "--json", out, timeout=150 * runs, collect=False)
    with open(out) as f:
        return {r["compression"]: r for r in json.load(f)["results"]}
