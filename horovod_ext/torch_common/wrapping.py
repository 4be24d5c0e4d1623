"""How the parameter-space optimizers (LeaderOptimizer, ElasticAveragingOptimizer, DiLoCoOptimizer) wrap a torch
optimizer: a class made of their mixin and the optimizer's own class, sharing its param_groups and state, and their
state in its state_dict() under one key."""
import itertools
import weakref

import torch

from horovod_ext.compression.horovod_args import check_named_parameters

STATE_KEY = "horovod_ext"
_ids = itertools.count()  # each wrapped optimizer's number, in its collectives' names


def wrap(mixin, optimizer, collectives):
    """An instance of (mixin, optimizer's class) holding the optimizer's attributes (the same param_groups and
    state objects). A learning-rate scheduler made before the wrap put its counting step() on the optimizer
    instance (it calls the optimizer class's step and marks the optimizer it watches as stepped): that one is
    replaced by one that calls the class's step (the mixin's) and marks the same optimizer, so that the scheduler
    neither bypasses the mixin nor warns that step() was not called. ``collectives``: the adapter's
    (collectives.py), at ``_hx_comm``."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"{mixin._hx_what} wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    cls = type(optimizer.__class__.__name__, (mixin, optimizer.__class__), {})
    # torch's Optimizer.load_state_dict wraps the class's step in its step hooks unless it is marked "hooked": the
    # mixin's step calls the optimizer's own, which runs the hooks, so a second wrap would run them twice
    cls.step.hooked = True
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    scheduled = wrapped.__dict__.pop("step", None)
    if getattr(scheduled, "_wrapped_by_lr_sched", False):
        watched, this = weakref.ref(optimizer), weakref.ref(wrapped)

        def step(*args, **kwargs):
            if watched() is not None:
                watched()._opt_called = True  # what the scheduler's own wrapper records
            return cls.step(this(), *args, **kwargs)

        step._wrapped_by_lr_sched = True
        wrapped.step = step
    wrapped._hx_comm = collectives
    return wrapped


def trainable(optimizer, named_parameters):
    """Sets the wrapped optimizer's number, parameters (those of its param_groups that require a gradient) and
    their names (named_parameters', checked; "param.i" where it names none)."""
    optimizer._hx_id = next(_ids)
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    names = check_named_parameters(named_parameters, params, optimizer._hx_what)
    optimizer._hx_params = params
    optimizer._hx_names = [names.get(id(p), f"param.{i}") for i, p in enumerate(params)]


class StateInCheckpoint:
    """state_dict() / load_state_dict() of the wrapped optimizer with the mixin's own state (its _hx_ours() and
    _hx_load_ours()) under STATE_KEY, and the wrapped optimizer's own step for Horovod's state-creating step."""

    def state_dict(self):
        state = super().state_dict()
        state[STATE_KEY] = self._hx_ours()
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        ours = state_dict.pop(STATE_KEY, None)
        super().load_state_dict(state_dict)
        if ours is not None:
            self._hx_load_ours(ours)

    def _hx_base_step(self, closure=None):
        """The wrapped optimizer's own step, without any collective (Horovod's state-creating step)."""
        return super(StateInCheckpoint, self).step(closure)
