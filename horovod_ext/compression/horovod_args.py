"""Checks of Horovod's own DistributedOptimizer / DistributedGradientTape arguments, shared by both adapters, with
Horovod 0.28.1's meaning (horovod/torch/optimizer.py, horovod/tensorflow/__init__.py)."""


def check_predivide(gradient_predivide_factor, op_is_average):
    """gradient_predivide_factor f: the sum is taken of g / f and multiplied by f / size afterwards (the same
    average, summed at a smaller magnitude: Horovod's fp16 overflow guard). Only meaningful with op=Average."""
    f = gradient_predivide_factor
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0:
        raise ValueError(f"gradient_predivide_factor must be a number > 0, got {f!r}")
    if f != 1.0 and not op_is_average:
        raise ValueError("gradient_predivide_factor != 1.0 is only allowed with op=hvd.Average")
    return float(f)


def check_groups(num_groups, groups):
    """Horovod's explicit allreduce grouping, num_groups (deprecated) or groups: a positive integer or a list of lists
    of parameters/variables, whose gradients Horovod allreduces as one grouped collective. horovod_ext sends each
    gradient by its compressor's own collectives (Horovod's tensor fusion batches the dense ones), so it refuses a
    grouping rather than ignore it. The defaults (0, None) pass."""
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be a non-negative integer, got {num_groups!r}")
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and not
                                                                isinstance(groups, bool) and groups > 0)):
        raise ValueError(f"groups must be a positive integer or a list of lists of parameters, got {groups!r}")
    if num_groups or groups is not None:
        given = (f"groups=<a list of {len(groups)} groups>" if isinstance(groups, list) else f"groups={groups!r}"
                 if groups is not None else f"num_groups={num_groups!r}")
        raise ValueError(f"{given}: horovod_ext does not group allreduces explicitly (Horovod's tensor fusion batches "
                         f"its dense collectives; HOROVOD_FUSION_THRESHOLD sets the batch); leave groups=None and "
                         f"num_groups=0, or use Horovod's own optimizer for explicit groups")


def check_named_parameters(named_parameters, params, what):
    """Horovod's rules for ``named_parameters`` (horovod/torch/optimizer.py), in one place for every optimizer
    that takes it: (name, parameter) pairs with unique names, naming every parameter the optimizer updates (it
    may name more). ``params`` is None where the optimizer's parameters are not known yet (a Keras optimizer
    before it is built): then only the pairs are checked. Returns {id(parameter): name}; None given: {}."""
    if named_parameters is None:
        return {}
    named = list(named_parameters)
    if any(not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], str) for pair in named):
        raise ValueError(f"{what}: named_parameters must be a sequence of (name, parameter) pairs with str names, "
                         f"e.g. model.named_parameters()")
    names = [name for name, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{what}: named_parameters holds duplicate names: {duplicates}; parameter names must be "
                         f"unique")
    by_id = {id(p): name for name, p in named}
    if params is not None:
        unnamed = [i for i, p in enumerate(params) if id(p) not in by_id]
        if unnamed:
            raise ValueError(f"{what}: named_parameters must name every parameter the optimizer updates "
                             f"(pass model.named_parameters() of the model whose parameters it holds); "
                             f"{len(unnamed)} of {len(params)} are not named (positions {unnamed[:8]})")
    return by_id


def outside_process_set(process_set):
    """Whether this rank is outside ``process_set``. Horovod's DistributedOptimizer registers no hooks there and its
    tape returns the local gradients: such a rank takes no part in the set's collectives and steps on its own
    gradients. Every rank is in the global set (whose included() can read False when both frameworks were
    imported: horovod_ext/consensus/init.py)."""
    from horovod.common.process_sets import global_process_set

    return process_set is not global_process_set and not process_set.included()
