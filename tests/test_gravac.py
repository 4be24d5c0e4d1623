"""GraVAC's controller: the decision truth table, the CF sequences of the policies, windows, settling, state."""
import pytest

from horovod_ext.compression.gravac import GravacController
from horovod_ext.compression.specs import AdaptiveTopK


def controller(**kwargs):
    return GravacController(AdaptiveTopK(**kwargs))


@pytest.mark.parametrize("gain_min, gain_c, path", [
    (0.95, 0.92, "candidate"),  # the candidate keeps enough energy
    (0.95, 0.90, "candidate"),  # >= epsilon counts
    (0.95, 0.85, "min"),        # only theta_min does
    (0.90, 0.50, "min"),
    (0.85, 0.50, "dense"),      # neither: dense, and the residual is reset
])
def test_decision_truth_table(gain_min, gain_c, path):
    c = controller(epsilon=0.9, window=100)
    got, cf, g_min, g_c = c.decide(1.0, gain_min, gain_c, 0.1)
    assert got == path and (g_min, g_c) == (pytest.approx(gain_min), pytest.approx(gain_c))
    assert cf == {"candidate": 20.0, "min": 10.0, "dense": 1.0}[path]


def candidates_over_windows(policy, windows, min_cf=10, max_cf=1000):
    c = controller(min_cf=min_cf, max_cf=max_cf, window=3, policy=policy, omega=0.0)
    seen = []
    for step in range(3 * windows):
        seen.append(c.candidate_cf())
        c.decide(1.0, 0.95, 0.5, 0.1 * (1 + step))  # throughputs differ: no settling
    return seen[::3]


def test_exponential_policy_sequence():
    assert candidates_over_windows("exponential", 6) == [20, 40, 160, 1000, 1000, 1000]


def test_geometric_policy_sequence():
    assert candidates_over_windows("geometric", 9) == [20, 40, 80, 160, 320, 640, 1000, 1000, 1000]


def test_never_exceeds_max_cf():
    for policy in ("exponential", "geometric"):
        assert max(candidates_over_windows(policy, 30, min_cf=7, max_cf=300)) == 300


def test_no_scale_up_before_a_window_ends():
    c = controller(window=5)
    for _ in range(4):
        c.decide(1.0, 0.95, 0.95, 0.1)
        assert c.candidate_cf() == 20.0
    c.decide(1.0, 0.95, 0.95, 0.1)
    assert c.candidate_cf() != 20.0


def test_theta_min_rises_when_the_candidate_loses_nothing():
    c = controller(window=2, omega=0.05)
    for step in range(2):
        c.decide(1.0, 0.95, 0.94, 0.1 * (1 + step))  # |0.95 - 0.94| / 0.95 < 0.05
    assert c.theta_min == 20.0 and c.candidate_cf() == 80.0  # theta_s 2 -> 4


def test_settles_on_the_lower_cf_when_throughputs_match():
    c = controller(window=2, omega=0.05)
    for _ in range(4):  # the same throughput in two windows (candidates 20, then 40)
        c.decide(1.0, 0.95, 0.5, 0.1)
    assert c.settled and c.theta_min == 20.0 and c.candidate_cf() == 20.0
    for _ in range(10):
        c.decide(1.0, 0.95, 0.5, 0.1)
    assert c.candidate_cf() == 20.0


def test_nonfinite_norms_raise():
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        controller().decide(float("nan"), 1.0, 1.0, 0.1)


def test_state_round_trip():
    c = controller(window=3)
    for step in range(7):
        c.decide(1.0 + step, 0.9, 0.6, 0.1)
    d = controller(window=3)
    d.load_state(c.state())
    for step in range(5):
        assert c.decide(2.0, 0.95, 0.91, 0.2) == d.decide(2.0, 0.95, 0.91, 0.2)
    assert c.state() == d.state()


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(min_cf=100, max_cf=10), "min_cf must be <= max_cf"), (dict(epsilon=0), "epsilon must be > 0.0"),
    (dict(epsilon=1.5), "epsilon must be in (0, 1]"), (dict(window=0), "window must be >= 1"),
    (dict(policy="linear"), "policy must be one of ('exponential', 'geometric')"), (dict(omega=1), "omega"),
])
def test_invalid_arguments(kwargs, fragment):
    with pytest.raises(ValueError) as err:
        AdaptiveTopK(**kwargs)
    assert fragment in str(err.value)
