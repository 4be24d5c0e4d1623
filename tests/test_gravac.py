"""GraVAC's controller: the decision truth table, the CF sequences of the policies, windows, the throughput table
filed under the CF actually sent, settling and its fallback, the EWMA, state; and, under horovodrun, that the step
time it sees includes communication (torch and TF) and that its defaults compress the digits MLP."""
import json
import math

import pytest

from horovod_ext.compressors.gravac import GravacController, ewma_weight, ladder
from horovod_ext.compressors.gravac import AdaptiveTopK
from hvdrun import horovodrun


def controller(nranks=1, **kwargs):
    return GravacController(AdaptiveTopK(**kwargs), nranks)


def squared(gain):
    """The squared norm |C(g_ef)|^2 a compressed gradient keeps for a given gain (|g_ef|^2 = 1)."""
    return gain * gain


class Workload:
    """A model whose compression gain depends on the CF and whose step time on the path: gain(cf) and
    seconds(cf) (cf 1 = dense). Feeds the controller as an adapter does: each decision gets the time of the step
    before it, which ran at the CF that step sent."""

    def __init__(self, gain, seconds):
        self.gain, self.seconds = gain, seconds
        self.sent = []  # (cf, gain of what was sent, seconds that step took)
        self.steps = 0

    def run(self, ctl, steps):
        last = 0.0
        for _ in range(steps):
            theta_min, theta_c = ctl.cfs()
            planned = ctl.planned
            path, cf, gain_min, gain_c = ctl.decide(1.0, squared(self.gain(theta_min)), squared(self.gain(theta_c)),
                                                    last)
            assert (path, cf) == planned  # decide() describes the step the previous decision planned
            sent_gain = {"min": gain_min, "dense": 1.0}[path]
            last = self.seconds(cf)
            self.sent.append((cf, sent_gain, last))
            self.steps += 1
        return ctl


@pytest.mark.parametrize("gain_min, gain_c, rung, path", [
    (0.95, 0.92, 0, "min"),     # the candidate is measured, never sent between windows
    (0.90, 0.50, 0, "min"),     # >= epsilon counts
    (0.85, 0.95, 0, "dense"),   # theta_min = min_cf below epsilon: dense, and the residual is reset
    (0.85, 0.50, 1, "min"),     # a rung above min_cf is held until its window ends
])
def test_decision_truth_table(gain_min, gain_c, rung, path):
    """The readings of a step decide the next step's path; the first step sends theta_min (no reading yet)."""
    c = controller(epsilon=0.9, window=100)
    c.rung = rung
    theta_min, theta_c = c.cfs()
    assert c.planned == ("min", 10.0)
    got, cf, g_min, g_c = c.decide(1.0, squared(gain_min), squared(gain_c), 0.1)
    assert (got, cf) == ("min", 10.0) and (g_min, g_c) == (pytest.approx(gain_min), pytest.approx(gain_c))
    assert c.planned == (path, {"min": theta_min, "dense": 1.0}[path])
    assert c.plan() == (theta_min, theta_c, ("min", "dense").index(path), c.planned[1])


def candidates_over_windows(policy, windows, min_cf=10, max_cf=1000, gain_c=0.9):
    """The candidate at each window's start, every candidate keeping gain_c (epsilon 0.7); step times that grow
    keep the throughputs apart (no settling)."""
    c = controller(min_cf=min_cf, max_cf=max_cf, window=3, policy=policy, omega=0.0)
    seen = []
    for step in range(3 * windows):
        seen.append(c.candidate_cf())
        c.decide(1.0, squared(0.95), squared(gain_c), 0.1 * (1 + step))
    return seen[::3]


def test_exponential_policy_sequence():
    assert ladder(AdaptiveTopK(policy="exponential")) == [10, 20, 40, 160, 1000]
    assert candidates_over_windows("exponential", 6) == [20, 40, 160, 1000, 1000, 1000]


def test_geometric_policy_sequence():
    assert ladder(AdaptiveTopK(policy="geometric")) == [10, 20, 40, 80, 160, 320, 640, 1000]
    assert candidates_over_windows("geometric", 9) == [20, 40, 80, 160, 320, 640, 1000, 1000, 1000]


def test_never_exceeds_max_cf():
    for policy in ("exponential", "geometric"):
        assert max(candidates_over_windows(policy, 30, min_cf=7, max_cf=300)) == 300
    assert ladder(AdaptiveTopK(min_cf=50, max_cf=50)) == [50]


def test_a_candidate_below_epsilon_is_tried_again_and_theta_min_stays():
    assert candidates_over_windows("exponential", 5, gain_c=0.5) == [20] * 5


def test_no_scale_up_before_a_window_ends():
    c = controller(window=5, omega=0.0)
    for _ in range(4):
        c.decide(1.0, squared(0.95), squared(0.9), 0.1)
        assert c.candidate_cf() == 20.0
    c.decide(1.0, squared(0.95), squared(0.9), 0.1)
    assert c.candidate_cf() == 40.0 and c.theta_min == 20.0


def test_theta_min_climbs_to_a_candidate_that_kept_epsilon_over_the_second_half_of_its_window():
    c = controller(nranks=100, window=4, omega=0.0)  # a = 1: each step's reading is the gain
    for gain_c in (0.9, 0.9, 0.5, 0.9):  # the second half dipped below epsilon 0.7: no climb
        c.decide(1.0, squared(0.95), squared(gain_c), 0.1)
    assert c.theta_min == 10.0 and c.candidate_cf() == 20.0
    for gain_c in (0.5, 0.5, 0.9, 0.9):
        c.decide(1.0, squared(0.95), squared(gain_c), 0.1)
    assert c.theta_min == 20.0 and c.candidate_cf() == 40.0


def test_a_climbed_rung_is_held_through_a_dip_then_steps_down():
    """theta_min above min_cf below epsilon is still sent (not dense) until its window ends, then steps down."""
    c = controller(nranks=100, window=2, omega=0.0)
    for _ in range(2):
        c.decide(1.0, squared(0.95), squared(0.9), 0.1)
    assert c.theta_min == 20.0 and c.planned == ("min", 20.0)
    sent = [c.decide(1.0, squared(0.2), squared(0.1), 0.1)[:2] for _ in range(2)]
    assert sent == [("min", 20.0), ("min", 20.0)]  # 20 read 0.2 < epsilon after the first: held, not dense
    assert c.theta_min == 10.0 and c.planned == ("min", 10.0)  # stepped down at the window's end


def test_compressing_at_10x_every_step_never_settles_on_dense():
    """Only CF 10 keeps epsilon; every step sends it, so dense has no throughput and cannot be chosen."""
    work = Workload(gain=lambda cf: 0.8 if cf <= 10 else 0.5, seconds=lambda cf: 1.0 if cf == 1 else 0.1)
    ctl = work.run(controller(window=10, omega=0.5), 400)
    assert {cf for cf, _, _ in work.sent} == {10.0}
    assert set(ctl.throughput_table()) == {10.0} and ctl.theta_ideal != 1.0
    assert ctl.totals["paths"] == {"min": 400, "dense": 0}
    assert [e["path"] for e in ctl.log] == ["min"] * ctl.spec.window  # the log keeps the last window


def test_always_dense_never_settles_on_a_compressed_cf():
    """No CF keeps epsilon: after the first step (theta_min, not yet measured) every step goes dense."""
    work = Workload(gain=lambda cf: 0.3, seconds=lambda cf: 0.1 if cf == 1 else 0.01)
    ctl = work.run(controller(window=10, omega=0.5), 400)
    assert [cf for cf, _, _ in work.sent] == [10.0] + [1.0] * 399
    assert ctl.throughput_table()[1.0][1] == 398 and ctl.theta_ideal is None and not ctl.settled


def test_throughput_is_the_mean_over_the_steps_that_sent_each_cf():
    """gain x steps/s, filed under the CF the step sent (candidate, theta_min or dense), from the next decision's
    step time."""
    gains = {1.0: 1.0, 10.0: 0.9, 20.0: 0.8, 40.0: 0.72, 160.0: 0.5, 1000.0: 0.2}
    seconds = {1.0: 0.5, 10.0: 0.11, 20.0: 0.07, 40.0: 0.05, 160.0: 0.045, 1000.0: 0.04}
    work = Workload(gain=lambda cf: gains[cf], seconds=lambda cf: seconds[cf])
    ctl = work.run(controller(window=7, omega=0.0, epsilon=0.75), 60)
    expected = {}
    for (cf, gain, seconds), _ in zip(work.sent, work.sent[1:]):  # the last step's time is not known yet
        expected.setdefault(cf, []).append(gain / seconds)
    table = ctl.throughput_table()
    assert set(table) == set(expected) and len(expected) >= 2
    for cf, values in expected.items():
        assert table[cf] == (pytest.approx(sum(values) / len(values)), len(values))


def test_settles_on_the_lower_of_two_saturated_cfs_and_steps_down_when_it_fails():
    # CF 20 and CF 40 give the same gain x speed (0.8 / 0.1 = 0.72 / 0.09): saturation, settle on 20
    gains = {10.0: 0.9, 20.0: 0.8, 40.0: 0.72, 160.0: 0.5, 1000.0: 0.2}
    seconds = {10.0: 0.2, 20.0: 0.1, 40.0: 0.09}
    work = Workload(gain=lambda cf: gains.get(cf, 1.0), seconds=lambda cf: seconds.get(cf, 1.0))
    ctl = work.run(controller(window=5, omega=0.01, epsilon=0.7), 15)
    # windows 1-3 sent 10, 20 and 40, each climbing to the candidate that kept epsilon; 40 matched 20's throughput
    assert [cf for cf, _, _ in work.sent] == [10.0] * 5 + [20.0] * 5 + [40.0] * 5
    assert ctl.theta_ideal == 20.0 and ctl.cfs() == (20.0, 20.0) and ctl.planned == ("min", 20.0)
    # the settled CF now fails epsilon: held to its window's end, then one rung down (10), never dense
    gains[20.0] = 0.2
    work.run(ctl, 300)
    assert work.sent[-1][0] == 10.0 and ctl.planned == ("min", 10.0) and ctl.cfs() == (10.0, 10.0)
    assert ctl.theta_ideal == 10.0 and all(cf != 1.0 for cf, _, _ in work.sent)


def test_ewma_weight_is_ranks_over_100_and_restarts_when_the_cf_changes():
    assert [ewma_weight(n) for n in (1, 2, 8, 100, 1000)] == [0.01, 0.02, 0.08, 1.0, 1.0]
    c = controller(nranks=8, window=2, omega=0.0)
    c.decide(1.0, squared(0.9), squared(0.85), 0.0)
    _, _, gain_min, gain_c = c.decide(1.0, squared(0.8), squared(0.75), 0.0)
    assert gain_min == pytest.approx(math.sqrt(0.92 * 0.81 + 0.08 * 0.64))
    assert gain_c == pytest.approx(math.sqrt(0.92 * 0.85 ** 2 + 0.08 * 0.75 ** 2))
    assert c.cfs() == (20.0, 40.0)  # climbed: 20 keeps the candidate's EWMA, the new candidate starts again
    _, _, gain_min, gain_c = c.decide(1.0, squared(0.7), squared(0.3), 0.0)
    assert gain_c == pytest.approx(0.3)
    assert gain_min == pytest.approx(math.sqrt(0.92 * (0.92 * 0.85 ** 2 + 0.08 * 0.75 ** 2) + 0.08 * 0.49))


def test_forgotten_step_time_records_nothing():
    c = controller(window=100)
    c.decide(1.0, squared(0.95), squared(0.5), 0.0)
    c.forget_step_time()  # e.g. the steps between went dense because a rank joined
    c.decide(1.0, squared(0.95), squared(0.5), 0.3)
    assert c.throughput_table() == {}
    c.decide(1.0, squared(0.95), squared(0.5), 0.2)
    assert c.throughput_table() == {10.0: (pytest.approx(0.95 / 0.2), 1)}


def test_factor_climbs_when_the_gain_rises_during_training():
    """At its defaults, on a workload whose gains at high CFs rise as training goes on (as gradients concentrate)
    and whose step time falls with the bytes sent, the CF climbs to at least 100 and then 1000 is sent."""
    spec = AdaptiveTopK()

    def gain(cf):  # early: only CF 10 keeps epsilon; later every CF up to 1000 keeps 0.9
        progress = min(1.0, work.steps / (6 * spec.window))
        return 0.9 - (1 - progress) * math.log10(cf / 10) if cf > 1 else 1.0

    work = Workload(gain=gain, seconds=lambda cf: 0.02 + 1.0 / cf)
    work.run(GravacController(spec, 2), 12 * spec.window)
    sent = [cf for cf, _, _ in work.sent]
    assert sent[:spec.window] == [10.0] * spec.window  # nothing above CF 10 keeps epsilon at first
    assert max(sent) >= 100 and sent[-1] >= 100
    assert sent.index(max(sent)) > 3 * spec.window  # it climbed as the gain rose, not at once


def test_nonfinite_norms_raise():
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        controller().decide(float("nan"), 1.0, 1.0, 0.1)


def test_state_round_trip():
    work = Workload(gain=lambda cf: {10.0: 0.9, 20.0: 0.8}.get(cf, 0.3), seconds=lambda cf: 0.01 * cf ** 0.5)
    c = work.run(controller(window=3, epsilon=0.75), 7)
    d = controller(window=3, epsilon=0.75)
    d.load_state(json.loads(json.dumps(c.state())))  # TF keeps it as JSON
    for step in range(12):
        assert c.decide(2.0, 1.2, 0.9, 0.2) == d.decide(2.0, 1.2, 0.9, 0.2)
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


# ------------------------------------------------------------------------------------------------- under horovodrun
@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_step_time_includes_communication(framework):
    """A 0.25 s delay injected into every payload collective shows in every step time the controller is fed
    (from the third step: a step's time is fed to the decision after the next), in both frameworks."""
    results, _ = horovodrun(2, "tests/workers/gravac_worker.py", framework, "0.25", timeout=300)
    for r in results:
        times = r["step_seconds"]
        # a step's time is known when it ends and reaches the controller with the next step's norms: the first
        # step has none, the second is fed the first's (which has no start)
        assert times[:2] == [None, None] and len(times) == r["steps"] >= 6
        assert all(t >= 0.25 for t in times[2:]), times
    assert results[0]["step_seconds"] == results[1]["step_seconds"]  # averaged over ranks: the same decision input


def test_decision_lag_keeps_ranks_identical_and_resumes_bit_for_bit():
    """Each step sends what the previous step's decision planned; every rank's CF sequence is the same; a run saved
    after 12 steps and resumed continues the sequence and ends on the same bits (omega 0: no decision reads a
    measured time)."""
    results, _ = horovodrun(2, "tests/workers/gravac_worker.py", "lag", timeout=300)
    steps = results[0]["uninterrupted"]
    assert all(r["uninterrupted"] == steps and r["resumed"] == steps and r["same_bits"] for r in results)
    for (_, _, planned), (cf, _, _) in zip(steps, steps[1:]):
        assert cf == planned
    assert steps[0][:2] == [2.0, "min"]  # the first step has no reading: theta_min
    assert len({cf for cf, _, _ in steps}) >= 3  # the CF moved at window ends (window 3)
