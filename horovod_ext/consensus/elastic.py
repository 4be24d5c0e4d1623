"""EASGD's bookkeeping, shared by the PyTorch and TensorFlow adapters (framework-free, scalars only).

Synchronous EASGD (Zhang, Choromanska, LeCun, NeurIPS 2015; the math is python/hvdext_reference/lsgd.py): every
`period` steps one allreduce gives mean_i(x_i), and from the values before the round

    center <- (1 - beta) * center + beta * mean_i(x_i)
    x_i    <- x_i - alpha * (x_i - center_old),          alpha = beta / p

The center starts as the mean of the workers at the first step (their common initial point after a broadcast).

Asynchronous EASGD (asynchronous=True, staleness bound D; the schedule is rounds.py): the allreduce of x_s starts
at step s and its mean is applied at step a = s + D, with the force taken at the step it is applied:

    center <- (1 - beta) * center + beta * mean_i(x_i[s])
    x_i[a] <- x_i[a] - alpha * (x_i[a] - center_old)

(Zhang et al.'s asynchronous EASGD lets each worker exchange with the center at its own pace; here every rank
applies the same rounds at the same steps, so every rank holds the same center.)
"""
from horovod_ext.compression.wire import allreduce_wire_bytes
from .leader import _check_period
from .rounds import check_staleness


class ElasticSync:
    what = "ElasticAveragingOptimizer"
    generation = 0  # the reset generation of its collectives' names, set when built (agreement.py)

    def __init__(self, beta=0.9, period=4, asynchronous=False, max_staleness=None, size=1):
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 < beta < 1.0:
            raise ValueError(f"beta must be a number in (0, 1) (EASGD's moving rate; default 0.9), got {beta!r}")
        self.beta = float(beta)
        self.period = _check_period("period", period)
        self.staleness = check_staleness(asynchronous, max_staleness, self.period)
        self.size = size
        self.alpha = self.beta / size

    @staticmethod
    def arguments(beta, period, asynchronous, max_staleness):
        """ElasticAveragingOptimizer's arguments by name, as both frameworks' factories take them."""
        return {"beta": beta, "period": period, "asynchronous": asynchronous, "max_staleness": max_staleness}

    def due(self, step):
        """The due mask of `step`: 1 every `period`-th step (the center's one level), else 0."""
        return int(step % self.period == 0)

    def account(self, stats, param_bytes, nranks):
        """Bytes of one allreduce of the parameters (a round, or the center's initialization)."""
        stats.add(payload_bytes=param_bytes, wire_bytes=allreduce_wire_bytes(param_bytes, nranks))

    def state(self):
        return {}

    def load_state(self, state):
        pass
