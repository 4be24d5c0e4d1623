"""Leader-based and elastic-averaging parameter updates: the definition, and the test oracle.

LSGD (Teng, Gao, Chalus, Choromanska, Goldfarb, Weller; "Leader Stochastic Gradient Descent for Distributed Training of
Deep Learning Models", NeurIPS 2019). Every worker i takes its own optimizer step and is pulled toward leaders, the
workers with the lowest running-average training loss. With a local leader x_L of i's group and a global
leader x_G, at a step where both pulls are due:

    x_i <- x_i - lr * g_i - pull * (x_i - x_L) - global_pull * (x_i - x_G)

With zero gradient that is the convex combination (1 - pull - global_pull) x_i + pull x_L + global_pull x_G:
one pull shrinks the distance to the leader by exactly the factor (1 - pull), and a leader is not moved by its
own pull. Single-leader LSGD is the case of one level (the global leader, weight `pull`).

Asynchronous LSGD with staleness D >= 1 (horovod_ext/consensus/rounds.py has the schedule): the round started at
step s is elected at s + 1, where the leaders send their parameters x_L[s+1], and is applied at a = s + 1 + D:

    x_i[a] <- x_i[a] + sum_k w_k * (x_Lk[s+1] - x_i[a])      over the levels k whose leader is not i itself

The forces are summed first and then added (leader_pull), as the adapters compute them, so the comparison is bit
for bit. With D = 0 (s + 1 replaced by s) it is the synchronous update. The paper evaluates the center variable,
mean_i(x_i), beside the leader: center().

EASGD (Zhang, Choromanska, LeCun; "Deep learning with Elastic Averaging SGD", NeurIPS 2015), synchronous form
with p workers, moving rate beta and alpha = beta / p. Every `period` steps, with every x_i and the center c
taken before the round (the updates are simultaneous, as in the paper's Eq. 5-6):

    c   <- (1 - beta) * c + beta * mean_i(x_i)
    x_i <- x_i - alpha * (x_i - c_old)

With zero gradients the workers' spread around their mean shrinks by (1 - alpha) per round.
"""
import numpy as np


def elect(means, counts, members):
    """The leader among `members` (global ranks): the lowest running-average loss, ties to the lowest rank.

    means[r], counts[r]: rank r's average loss over the window and how many losses it holds. Returns the rank.
    Raises ValueError if a member reported no loss, FloatingPointError if a member's loss is NaN or Inf."""
    missing = [r for r in members if counts[r] == 0]
    if missing:
        raise ValueError(f"no training loss reported on rank(s) {missing}")
    bad = [r for r in members if not np.isfinite(means[r])]
    if bad:
        raise FloatingPointError(f"NaN or Inf training loss reported on rank(s) {bad}")
    return min(members, key=lambda r: (means[r], r))


def leader_pull(x, targets):
    """x + sum_k w_k * (T_k - x) for targets [(w_k, T_k)], every force computed from the same x and the forces
    summed before they are added to x. x keeps its dtype (float32 or float64)."""
    x = np.asarray(x)
    force = None
    for weight, target in targets:
        term = (np.asarray(target, dtype=x.dtype) - x) * x.dtype.type(weight)
        force = term if force is None else force + term
    return x.copy() if force is None else x + force


def center(workers):
    """The center variable: the workers' average, mean_i(x_i) (the paper's evaluated point beside the leader)."""
    return np.mean([np.asarray(w, dtype=np.float64) for w in workers], axis=0)


def easgd_round(workers, center, beta):
    """One synchronous EASGD round: (new worker parameters, new center), from the values before the round."""
    workers = [np.asarray(w, dtype=np.float64) for w in workers]
    center = np.asarray(center, dtype=np.float64)
    alpha = beta / len(workers)
    mean = np.mean(workers, axis=0)
    return [w - alpha * (w - center) for w in workers], (1.0 - beta) * center + beta * mean


def scheduled_leader_pulls(xs, losses, levels, staleness):
    """LSGD's pulls over a run, synchronous (staleness 0) or asynchronous: the parameters each rank holds after
    each step's pulls (before its local optimizer step).

    xs[k][r]: rank r's parameters at the start of step k + 1 (steps count from 1); losses[k][r]: the loss rank r
    reported at step k + 1; levels[r]: rank r's levels, [(name, members, period, weight)] (the same names and
    periods on every rank). A round starts at every step where a level is due, with the mean loss of each rank
    since the previous round; it is elected at e = s + lag (lag = 1 if staleness else 0) from those means,
    and the leaders' parameters xs[e][leader] are applied at a = e + staleness to xs[a], except by the leader
    itself. Rounds whose pull falls after the last step are left out."""
    xs, losses = np.asarray(xs), np.asarray(losses, dtype=np.float64)
    steps, ranks = losses.shape
    lag = 1 if staleness else 0
    out = xs.copy()
    last = 0
    for s in range(1, steps + 1):
        due = {name for name, _, period, _ in levels[0] if s % period == 0}
        if not due:
            continue
        means = losses[last:s].mean(axis=0)
        last = s
        e = s + lag
        a = e + staleness
        if a > steps:
            continue
        for r in range(ranks):
            targets = []
            for name, members, _, weight in levels[r]:
                if name in due and weight > 0 and len(members) > 1:
                    leader = elect(means, [1] * ranks, members)
                    if leader != r:
                        targets.append((weight, xs[e - 1][leader]))
            out[a - 1][r] = leader_pull(xs[a - 1][r], targets)
    return out
