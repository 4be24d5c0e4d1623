"""Leader-based and elastic-averaging parameter updates: the definition, and the test oracle.

LSGD (Teng, Tan, Sahin, Choromanska, Ozturk, Nicolai; "Leader Stochastic Gradient Descent for Distributed Training
of Deep Learning Models", NeurIPS 2019). Every worker i takes its own optimizer step and is pulled toward leaders,
the workers with the lowest running-average training loss. With a local leader x_L of i's group and a global
leader x_G, at a step where both pulls are due:

    x_i <- x_i - lr * g_i - pull * (x_i - x_L) - global_pull * (x_i - x_G)

With zero gradient that is the convex combination (1 - pull - global_pull) x_i + pull x_L + global_pull x_G:
one pull shrinks the distance to the leader by exactly the factor (1 - pull), and a leader is not moved by its
own pull. Single-leader LSGD is the case of one level (the global leader, weight `pull`).

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
    """x + sum_k w_k * (T_k - x) for targets [(w_k, T_k)], every force computed from the same x."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    for weight, target in targets:
        out += weight * (np.asarray(target, dtype=np.float64) - x)
    return out


def easgd_round(workers, center, beta):
    """One synchronous EASGD round: (new worker parameters, new center), from the values before the round."""
    workers = [np.asarray(w, dtype=np.float64) for w in workers]
    center = np.asarray(center, dtype=np.float64)
    alpha = beta / len(workers)
    mean = np.mean(workers, axis=0)
    return [w - alpha * (w - center) for w in workers], (1.0 - beta) * center + beta * mean
