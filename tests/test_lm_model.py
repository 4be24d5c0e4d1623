"""The low-communication benchmark's language model (benchmarks/lm.py): its data are next-token pairs, it is causal,
it starts near uniform and AdamW trains it."""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import lm  # noqa: E402


def test_sequences_are_next_token_pairs_and_the_test_set_is_the_end_of_the_text():
    x, y, x_test, y_test = lm.pydoc_sequences(context=16)
    assert x.shape[1] == y.shape[1] == 16 and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    assert torch.equal(y[:-1, -1], x[1:, 0])  # sequences follow each other without overlap
    assert len(x_test) * 8 < len(x) < len(x_test) * 10
    assert int(x.max()) < 2000 and int(x_test.max()) < 2000


def test_the_model_is_causal():
    """A change at position t changes no output before t."""
    model, _ = lm.build(context=16)
    x = torch.randint(2000, (2, 16), generator=torch.Generator().manual_seed(0))
    changed = x.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 2000
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert torch.equal(a[:, :9], b[:, :9])
    assert not torch.equal(a[:, 9:], b[:, 9:])


def test_adamw_trains_it_from_near_uniform():
    model, (x, y, x_test, y_test) = lm.build(context=16, layers=1)
    start, _ = lm.evaluate(model, x_test, y_test)
    assert abs(start - math.log(2000)) < 0.5
    opt, schedule = lm.inner_optimizer(model)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        idx = torch.randint(len(x), (32,), generator=gen)
        loss = lm.loss_fn(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    end, accuracy = lm.evaluate(model, x_test, y_test)
    assert end < start - 2.0 and accuracy > 0.2
    assert lm.perplexity(end) < math.exp(start - 2.0)


def test_diloco_method_names_give_the_optimizer_arguments():
    """benchmarks/diloco_methods.py: the benchmarks' DiLoCo variants by name."""
    import diloco_methods

    assert diloco_methods.diloco_settings("diloco") == {"compression": "none", "groups": None, "outer": "average"}
    assert diloco_methods.diloco_settings("diloco-ternary-h10-lr0.35-m0.5-node", inner_steps=50) == {
        "compression": "ternary", "groups": "node", "inner_steps": 10, "outer_lr": 0.35, "outer_momentum": 0.5,
        "outer": "average"}
    assert diloco_methods.diloco_settings("diloco-ternary-h48-p4-t6-a0.5-leader") == {
        "compression": "ternary", "groups": None, "inner_steps": 48, "fragments": 4, "overlap": 6,
        "merge_alpha": 0.5, "outer": "leader"}
    assert diloco_methods.diloco_settings("diloco-topk", inner_steps=50)["inner_steps"] == 50
    for bad in ("dilocox", "diloco-h", "diloco-lrx", "diloco-fp8", "dense"):
        assert not diloco_methods.is_diloco(bad)
    try:
        diloco_methods.diloco_settings("diloco-fp8")
    except ValueError as exc:
        assert "diloco-fp8" in str(exc) and "-lr<x>" in str(exc)
    else:
        raise AssertionError("diloco-fp8 accepted")
