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
    """Horovod's allreduce grouping: num_groups (deprecated) or groups, a positive integer or a list of lists of
    parameters/variables. Grouping only batches allreduces into one fused collective (Horovod's tensor fusion
    batches them here too), so a valid value changes no result."""
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be a non-negative integer, got {num_groups!r}")
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and not
                                                                isinstance(groups, bool) and groups > 0)):
        raise ValueError(f"groups must be a positive integer or a list of lists of parameters, got {groups!r}")
