"""Length policies and the draft selector: estimators, argmax, transitions, γ = 0, and losslessness."""

import math
import random
from types import SimpleNamespace

import pytest

from specviz.core.drafters import Drafter, ModelDrafter, NGramDrafter
from specviz.core.engine import decode
from specviz.core.formulas import expected_tokens
from specviz.core.policy import Outcome
from specviz.core.registry import GAMMA_POLICIES
from specviz.methods.estimation import Calibration, History, ProbeSchedule, VerifyCost, continuation, predicted_rates
from specviz.methods.policies import ConfidencePolicy, FSMPolicy, HFHeuristicPolicy, OnlinePolicy, make_policy
from specviz.methods.selection import OnlineSelector, PerDrafterPolicy
from specviz.models.backends import cached_model
from tests.test_engine import PROMPTS, reference

DRAFTER = SimpleNamespace(name="d")


def event(gamma, accepted, draft_ms=1.0, verify_ms=40.0, drafter="d"):
    return Outcome(gamma, accepted, draft_ms * gamma, verify_ms, accepted + 1, verify_ms + draft_ms * gamma, None, drafter)


def test_a_tree_is_priced_by_the_depth_it_reaches():
    """With token trees γ is the node budget: acceptance is censored at the tree's depth, and a budget's expected tokens
    are those of the depth it reached (measured at that budget, else scaled by the window's depth per node)."""
    hist = History()
    for accepted in (3, 1, 3, 2):
        hist.add(Outcome(8, accepted, 8.0, 40.0, accepted + 1, 48.0, depth=3))
    assert hist.acceptance() == pytest.approx(9 / (9 + 2))  # two steps stopped short of depth 3
    assert hist.depth_of(8) == 3 and hist.depth_of(4) == pytest.approx(1.5)
    chain = History()
    chain.add(Outcome(4, 2, 4.0, 40.0, 3, 44.0))
    assert chain.depth_of(6) == 6  # a chain reaches its γ


def simulate(alpha, gamma, steps, seed=0):
    rng = random.Random(seed)
    for _ in range(steps):
        v = 0
        while v < gamma and rng.random() < alpha:
            v += 1
        yield v


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.85])
def test_mle_recovers_true_rate_and_naive_does_not(alpha):
    hist = History(h=5000, acc_max=0.999)
    for v in simulate(alpha, 4, 5000):
        hist.add(Outcome(4, v, 4.0, 40.0, v + 1, 44.0))
    assert hist.acceptance() == pytest.approx(alpha, abs=0.02)
    assert hist.naive_acceptance() < alpha - 0.05


def test_acceptance_is_capped():
    hist = History(acc_max=0.9)
    hist.add(Outcome(4, 4, 4.0, 40.0, 5, 44.0))
    assert hist.acceptance() == 0.9


def test_expected_tokens_and_argmax_by_hand():
    assert expected_tokens(0.5, 0) == 1
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    # a_q = 10 ms, b_p = 40 ms flat: γ=0 → 1/40 = 25 tok/s; γ=1 → 1.5/50 = 30; γ=2 → 1.75/60 = 29.2
    rates = predicted_rates(0.5, 10.0, VerifyCost({0: 40.0, 1: 40.0}), 3)
    assert rates[0] == pytest.approx(25.0) and rates[1] == pytest.approx(30.0)
    assert max(rates, key=rates.get) == 1
    # drafting costs more than it saves: γ = 0 wins
    rates = predicted_rates(0.1, 30.0, VerifyCost({0: 40.0, 1: 40.0}), 3)
    assert max(rates, key=rates.get) == 0
    # a plain step at 25 ms (1e3/25 = 40 tok/s) beats γ = 1 at 40 ms (1.5/50 ms = 30 tok/s)
    rates = predicted_rates(0.5, 10.0, VerifyCost({0: 25.0, 1: 40.0}), 3)
    assert rates[0] == pytest.approx(40.0) and max(rates, key=rates.get) == 0
    assert predicted_rates(0.5, 10.0, VerifyCost({1: 40.0}), 3)[0] == pytest.approx(25.0)


def test_verify_model_keeps_each_gamma_and_the_plain_step_apart():
    hist = History(h=4)
    assert hist.verify_model() is None
    hist.add(Outcome(0, 0, 0.0, 25.0, 1, 25.0))
    assert hist.verify_model() == VerifyCost({0: 25.0})
    for g in (1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4):  # thrice the window: the plain step must survive them
        hist.add(Outcome(g, 0, 1.0, 40 + 3 * g, 1, 0.0))
    cost = hist.verify_model()
    assert cost == VerifyCost({0: 25.0, 1: 43.0, 2: 46.0, 3: 49.0, 4: 52.0})
    assert cost(0) == 25.0 and cost(6) == 52.0  # past the longest measured: its cost, a lower bound
    assert hist.acceptance() == 0.0 and len(hist.drafted()) == 4
    for ms in (60.0, 50.0, 58.0, 52.0, 57.0):  # each γ keeps its own last h times
        hist.add(Outcome(1, 0, 1.0, ms, 1, 0.0))
    assert hist.verify_model()(1) == pytest.approx(54.25) and hist.verify_model()(2) == 46.0


def test_a_measured_gamma_keeps_its_own_verify_cost_where_a_line_would_miss_a_kernel_step():
    hist = History(h=8)
    for g in (1, 2, 3, 1, 2, 3, 4):  # cheap up to γ = 3, then a slower kernel
        hist.add(Outcome(g, 0, 1.0, 30.0 if g == 4 else 20.0 + 0.5 * g, 1, 0.0))
    cost = hist.verify_model()
    assert cost(3) == pytest.approx(21.5) and cost(4) == pytest.approx(30.0) and cost(6) == pytest.approx(30.0)
    # acceptance 0.85, 0.5 ms per draft: a line through those seven steps would rate γ = 5 best; the measured costs keep γ = 3
    rates = predicted_rates(0.85, 0.5, cost, cost.longest_priced(6), 1)
    assert max(rates, key=rates.get) == 3 and max(rates) == 5


def test_a_long_gamma_keeps_its_measured_cost_after_the_window_has_moved_on():
    """A run at one γ must not forget that a longer one verified on a slower kernel, or the policy would price every
    longer draft as cheap as that γ and jump to the longest."""
    hist = History(h=4)
    hist.add(Outcome(0, 0, 0.0, 29.0, 1, 29.0))
    for g, ms in ((6, 62.0), (5, 61.0), (4, 62.0)):
        hist.add(Outcome(g, g, 1.0, ms, g + 1, 0.0))
    for _ in range(8):  # twice the window, all at γ = 3
        hist.add(Outcome(3, 3, 1.0, 39.0, 4, 0.0))
    cost = hist.verify_model()
    assert [s.drafted for s in hist.drafted()] == [3] * 4
    assert cost(3) == 39.0 and cost(4) == 62.0 and cost(6) == 62.0 and cost(10) == 62.0
    forgot = VerifyCost({0: cost(0), 3: 39.0})  # the window's costs alone
    assert max(predicted_rates(0.8, 1.6, cost, cost.longest_priced(10), 1).items(), key=lambda kv: kv[1])[0] <= 3  # γ = 2 unmeasured: tried
    assert max(predicted_rates(0.8, 1.6, forgot, 10, 1).items(), key=lambda kv: kv[1])[0] > 6  # past all it measured


def test_an_unmeasured_short_gamma_is_priced_at_the_nearest_shorter_verify_so_it_gets_tried():
    hist = History(h=8)
    hist.add(Outcome(0, 0, 0.0, 20.0, 1, 20.0))
    for g in (4, 4, 5, 4, 5, 4):  # only long, slow verifies so far
        hist.add(Outcome(g, 0, 1.0, 30.0 + 4 * (g - 4), 1, 0.0))
    cost = hist.verify_model()
    assert cost(1) == cost(3) == 20.0 and cost(4) == 30.0 and cost(6) == 34.0
    rates = predicted_rates(0.5, 0.5, cost, cost.longest_priced(6), 1)
    assert max(rates, key=rates.get) == 3  # so a short γ is tried next
    hist.add(Outcome(3, 0, 1.0, 21.0, 1, 0.0))
    assert hist.verify_model()(2) == 20.0 and hist.verify_model()(3) == 21.0
    no_plain = History(h=8)
    for g in (3, 6):
        no_plain.add(Outcome(g, 0, 1.0, 20.0 + 5 * g, 1, 0.0))
    assert no_plain.verify_model()(1) == 35.0  # nothing shorter known: the nearest longer, an upper bound
    assert no_plain.verify_model()(4) == 35.0 and no_plain.verify_model()(7) == 50.0


def test_the_online_policy_learns_a_kernel_staircase_one_gamma_at_a_time():
    """With verify costs that step up (3 rows as cheap as 2, 5 rows twice a plain step) and drafts that are always
    accepted early on, the policy must climb one γ at a time and settle, not try the longest γ on a guessed price and
    walk back down through every slow one."""
    def verify_ms(g):
        return 29.0 if g <= 1 else 39.0 if g <= 3 else 62.0
    policy, chosen = OnlinePolicy(calibrated_stop=False, gamma=1), []
    for step in range(30):
        gamma = policy.choose(DRAFTER, []).gamma
        chosen.append(gamma)
        accepted = gamma if step < 3 else min(gamma, step % 2)  # a lucky start, then one step in two keeps one token
        policy.observe(Outcome(gamma, accepted, 2.0 * gamma, verify_ms(gamma), accepted + 1, verify_ms(gamma) + 2.0 * gamma,
                               None, "d"))
    assert chosen[0] == 1 and 0 not in chosen  # the initial γ; drafting always pays here, so no plain step
    assert max(chosen) <= 4 and sum(g >= 4 for g in chosen) == 1  # the slow kernel tried once, never jumped to first
    assert all(g <= max(chosen[:i]) + 1 for i, g in enumerate(chosen) if i)
    assert chosen[-5:] == [1] * 5


def test_the_machine_profile_shapes_unmeasured_gammas_and_the_run_scales_it():
    """A profile measured at load gives the staircase's shape, the run's own verify times its scale: a machine twice as
    busy as at load prices every γ of the profile twice the profile's; past the profile, the nearest measured γ."""
    profile = {0: 28.0, 1: 30.0, 2: 30.0, 3: 40.0, 4: 40.0, 5: 60.0}
    busy = VerifyCost({1: 60.0}, profile, 2.0)
    assert busy(0) == pytest.approx(56.0) and busy(2) == 60.0 and busy(3) == 80.0 and busy(5) == 120.0
    assert busy.longest_priced(10) == 5 and busy.longest_priced(4) == 4  # the whole profile, within γ_max
    cost = VerifyCost({1: 60.0, 3: 70.0}, profile, 2.0)
    assert cost(7) == 70.0 and cost.longest_priced(10) == 5  # past the profile: the nearest shorter measured, one beyond
    assert VerifyCost({1: 60.0, 6: 90.0}, profile, 2.0).longest_priced(10) == 7
    hist = History(h=8)
    for g in (1, 1, 3, 1, 0):
        hist.add(Outcome(g, 0, 1.0, 2 * profile[g], 1, 0.0))
    assert hist.verify_model(profile) == VerifyCost({0: 56.0, 1: 60.0, 3: 80.0}, profile, 2.0)


def test_one_slow_step_does_not_price_its_gamma_out_where_the_profile_gives_the_shape():
    """On a busy core one verify can take several times its usual time (the scheduler, not the γ). A per-γ mean would
    price that γ out until it is taken again, which may be never; the profile's scale is a median over every γ's steps."""
    profile = {0: 28.0, 1: 30.0, 2: 30.0, 3: 40.0}
    hist = History(h=8)
    hist.add(Outcome(1, 0, 1.0, 200.0, 1, 0.0))  # the first step, on a busy core
    for _ in range(5):
        hist.add(Outcome(3, 3, 1.0, 44.0, 4, 0.0))
    cost = hist.verify_model(profile)
    assert cost(1) == pytest.approx(33.0) and cost(3) == pytest.approx(44.0)  # 1.1 × the profile, from the median
    assert hist.verify_model()(1) == 200.0  # without a profile, a γ keeps its own mean
    for _ in range(8):  # the machine gets busier: every γ's price follows
        hist.add(Outcome(3, 3, 1.0, 80.0, 4, 0.0))
    assert hist.verify_model(profile)(1) == pytest.approx(60.0)


def test_with_the_machine_profile_the_online_policy_takes_the_staircase_best_gamma_without_climbing_to_it():
    """The staircase of the test above, known from the profile: once a step has shown the acceptance, the policy
    goes to the γ that the profile prices best, skipping the one between, and never tries the slow kernel; without the
    profile it climbs one γ at a time."""
    def verify_ms(g):
        return 29.0 if g <= 1 else 39.0 if g <= 3 else 62.0

    def run(policy):
        chosen = []
        for step in range(20):
            gamma = policy.choose(DRAFTER, []).gamma
            chosen.append(gamma)
            accepted = gamma if step % 2 == 0 else min(gamma, 1)  # every other step is rejected after one token
            policy.observe(Outcome(gamma, accepted, 2.0 * gamma, verify_ms(gamma), accepted + 1,
                                   verify_ms(gamma) + 2.0 * gamma, None, "d"))
        return chosen, policy
    profile = {g: verify_ms(g) - 1.0 for g in range(11)}
    chosen, policy = run(OnlinePolicy(calibrated_stop=False, gamma=1, profile=profile))
    assert chosen[:2] == [1, 3] and set(chosen) == {1, 3}  # γ 2 costs as much as 3; from γ 4 on a step costs 62 ms
    b_p = policy.choose(DRAFTER, []).why()["b_p_ms"]
    scales = {round(b_p[str(g)] / profile[g], 9) for g in range(11)}  # every γ priced at one scale of the profile
    assert set(b_p) == {str(g) for g in range(11)} and len(scales) == 1 and 39.0 / 38.0 - 1e-6 <= scales.pop() <= 29.0 / 28.0
    assert run(OnlinePolicy(calibrated_stop=False, gamma=1))[0][:2] == [1, 2]


def test_online_policy_picks_zero_then_probes():
    policy = OnlinePolicy(calibrated_stop=False, gamma=4, probe=3)
    for _ in range(10):
        policy.observe(event(4, 0, draft_ms=30.0))
    choices = []
    for _ in range(6):
        choices.append(policy.choose(DRAFTER, []).gamma)
        policy.observe(event(choices[-1], 0, draft_ms=30.0) if choices[-1] else event(0, 0))
    assert choices.count(0) >= 4 and 1 in choices
    assert "pred_tok_s" in policy.choose(DRAFTER, []).why()


def test_online_policy_probes_at_the_drafting_gamma_it_predicts_fastest():
    # stock kernels' staircase: a verify of 1 or 2 drafts costs more than one of 3 or 4 (the profile measured at load)
    profile = {0: 50.0, 1: 87.0, 2: 112.0, 3: 76.0, 4: 70.0, 5: 77.0}
    policy = OnlinePolicy(calibrated_stop=False, gamma=3, probe=2, profile=profile)
    policy.observe(event(0, 0, verify_ms=50.0, drafter="target"))
    policy.observe(event(3, 0, draft_ms=6.0, verify_ms=76.0))  # an unlucky first draft: nothing kept
    choices = [policy.choose(DRAFTER, []) for _ in range(2)]
    assert [c.gamma for c in choices] == [0, 4] and choices[1].why()["reason"].startswith("probe")
    rates = choices[1].why()["pred_tok_s"]
    assert max((g for g in rates if g != "0"), key=rates.get) == "4" and rates["1"] < rates["4"] < rates["0"]


def test_online_policy_goes_long_one_gamma_at_a_time_when_acceptance_is_high():
    policy = OnlinePolicy(calibrated_stop=False, gamma=2)
    choice = policy.choose(DRAFTER, [])
    assert choice.gamma == 2 and "initial" in choice.why()["reason"]
    for _ in range(10):
        policy.observe(event(2, 2, draft_ms=1.0))
    choice = policy.choose(DRAFTER, [])
    assert choice.gamma == 3  # one beyond the longest verified; no step spent only to time a plain one
    b_p = choice.why()["b_p_ms"]
    assert b_p == {"0": 40.0, "1": 40.0, "2": 40.0, "3": 40.0}  # γ = 0 and 1 at the shortest measured verify until taken
    climb = []
    for _ in range(6):  # every draft accepted at a flat cost: one γ longer each step, up to γ_max
        climb.append(policy.choose(DRAFTER, []).gamma)
        policy.observe(event(climb[-1], climb[-1], draft_ms=1.0))
    assert climb == [3, 4, 5, 6, 7, 8]


def test_online_policy_takes_a_plain_step_only_where_drafting_loses_even_against_an_upper_bound_of_its_cost():
    def after(accepted: int, plain_ms: float | None = None) -> OnlinePolicy:
        policy = OnlinePolicy(calibrated_stop=False, gamma=4)
        if plain_ms is not None:
            policy.observe(event(0, 0, verify_ms=plain_ms, drafter="target"))
        for _ in range(10):
            policy.observe(event(4, accepted, draft_ms=5.0, verify_ms=40.0))
        return policy

    # every draft half kept: γ > 0 even with a plain step priced as dear as a verify of 4
    assert after(2).choose(DRAFTER, []).gamma > 0
    # nothing kept: drafting loses at any price of the plain step, which is then taken (and timed)
    choice = after(0).choose(DRAFTER, [])
    assert choice.gamma == 0 and choice.why()["b_p_ms"]["0"] == 40.0
    # a draft of 4 keeping one token in two: drafting beats the upper bound, but not a plain step timed at 10 ms
    assert after(1).choose(DRAFTER, []).gamma > 0 and after(1, plain_ms=10.0).choose(DRAFTER, []).gamma == 0


def test_online_policy_does_not_give_up_on_one_rejected_step_unless_asked_for_the_pure_mle():
    def after_one_rejection(**kw):
        policy = OnlinePolicy(calibrated_stop=False, gamma=4, **kw)
        policy.observe(event(0, 0, verify_ms=49.0, drafter="target"))
        policy.observe(event(4, 0, draft_ms=1.0, verify_ms=58.0))
        return policy

    # one pseudo-observation at 0.5: acc = 0.5 / 2 = 0.25; γ = 2 → 1.31 / 60 ms = 21.9 tok/s > plain 1 / 49 ms = 20.4
    policy = after_one_rejection()
    choice = policy.choose(DRAFTER, [])
    assert choice.gamma == 2 and choice.why()["acc"] == pytest.approx(0.25) and choice.why()["acc_mle"] == 0
    assert after_one_rejection(prior_weight=0).choose(DRAFTER, []).gamma == 0  # the paper's MLE: 0 after one observation
    for _ in range(2):
        policy.observe(event(1, 0, draft_ms=1.0, verify_ms=58.0))
    assert policy.choose(DRAFTER, []).gamma == 0  # 0.5 / 4 = 0.125: three rejections are evidence enough


def test_online_policy_stops_drafting_when_a_verify_costs_more_than_the_accepted_tokens_repay():
    # CPU fp32 shape: a plain step 39 ms, any verify 62 ms; acceptance 0.25 repays 1.33 tokens at best
    policy = OnlinePolicy(calibrated_stop=False, gamma=4, probe=100)
    policy.observe(event(0, 0, verify_ms=39.0, drafter="target"))
    for v in (1, 0, 0, 1, 0, 0, 0, 1):
        policy.observe(event(2, v, draft_ms=1.0, verify_ms=62.0))
    assert policy.choose(DRAFTER, []).gamma == 1  # γ = 1 is not measured yet, and might cost no more than a plain step
    policy.observe(event(1, 0, draft_ms=1.0, verify_ms=62.0))
    assert policy.choose(DRAFTER, []).gamma == 0


def test_probes_back_off_while_they_do_not_pay_and_start_over_when_drafting_wins():
    probes = ProbeSchedule(base=2, cap=8)
    assert [probes.plain() for _ in range(2 + 4 + 8 + 8)] == [False, True] + [False] * 3 + [True] + ([False] * 7 + [True]) * 2
    probes.drafting()
    assert [probes.plain() for _ in range(2)] == [False, True]


def test_fsm_transitions():
    p = FSMPolicy(gamma=3, gamma_min=1, gamma_max=4)
    p.observe(event(3, 3))
    assert p.gamma == 4
    p.observe(event(4, 4))
    assert p.gamma == 4
    for _ in range(5):
        p.observe(event(p.gamma, 0))
    assert p.gamma == 1
    p.observe(event(0, 0))  # a step with nothing drafted changes nothing
    assert p.gamma == 1


def test_hf_heuristic_schedule():
    p = HFHeuristicPolicy(gamma=5)
    p.observe(event(5, 5))
    assert p.gamma == 7
    p.observe(event(7, 2))
    assert p.gamma == 6


def test_confidence_stop_rule():
    """transformers' rule: stop after the first token whose draft probability is below the threshold (it stays)."""
    p = ConfidencePolicy(threshold=0.4).choose(DRAFTER, [])
    assert p.gamma == 10 and p.stop([0.9, 0.4 - 1e-3])
    assert not p.stop([0.1, 0.5])  # only the token just drawn counts


def test_calibration_learns_the_accepted_tokens_and_the_first_rejected_one_only():
    cal = Calibration(bins=10, weight=2.0)
    assert cal(0.97) == pytest.approx(0.95) and cal(0.12) == pytest.approx(0.15)  # before any step: the bin's midpoint
    cal.add(Outcome(4, 1, 4.0, 40.0, 2, 44.0, confidence=(0.97, 0.12, 0.12, 0.97)))
    assert cal.seen == [0, 1, 0, 0, 0, 0, 0, 0, 0, 1] and cal.accepted[9] == 1 and cal.accepted[1] == 0
    assert cal(0.97) == pytest.approx((1 + 2 * 0.95) / 3) and cal(0.12) == pytest.approx(2 * 0.15 / 3)
    cal.add(Outcome(3, 1, 3.0, 40.0, 1, 43.0, confidence=(0.55, 0.55, 0.55)))  # cut short by a stop token after one
    assert cal.seen[5] == 1 and cal.accepted[5] == 1  # the token after it was never tested
    cal.add(Outcome(2, 2, 2.0, 40.0, 3, 42.0))  # a step no stop rule read teaches nothing
    assert sum(cal.seen) == 3


def test_the_calibrated_stop_drafts_on_while_a_longer_draft_is_worth_its_time():
    """A draft of g tokens is worth E[tokens] − rate·(g·a_q + b_p(g)); the rule stops where no longer draft is worth more."""
    b_p = VerifyCost({0: 30.0, 1: 31.0, 2: 38.0, 3: 39.0, 4: 60.0})
    cal, acc, rate = Calibration(), 0.6, 0.05

    def worth(reaches, g):
        return 1 + sum(math.prod(reaches[:j]) for j in range(1, g + 1)) - rate * (g + b_p(g))

    most, stop = continuation(cal, acc, 1.0, b_p, rate, 1, 4)
    assert most == max(range(1, 5), key=lambda g: worth([0.95] * 4, g)) == 3  # were every token as likely as the best bin's

    def brute(path):
        reaches = [cal(c) for c in path] + [acc] * (most - len(path))
        return max(worth(reaches, g) for g in range(len(path) + 1, most + 1)) <= worth(reaches, len(path))

    for path in ([0.97], [0.05], [0.97, 0.97], [0.97, 0.5], [0.5], [0.3, 0.99]):
        assert stop(path) == brute(path), path
    assert not stop([0.97]) and stop([0.05])  # a confident token is worth the step up to 3 rows; a doubtful one is not
    assert continuation(cal, acc, 1.0, b_p, rate, 4, 4)[0] == 4  # never below γ*


def test_online_policy_with_the_calibrated_stop_drafts_up_to_its_longest_priced_gamma_on_single_paths_only():
    profile = {0: 30.0, 1: 31.0, 2: 38.0, 3: 39.0, 4: 60.0}
    policy = OnlinePolicy(gamma=1, profile=profile)
    for v in (1, 0, 1, 1):
        policy.observe(event(1, v, verify_ms=31.0))
    choice = policy.choose(DRAFTER, [])
    why = choice.why()
    assert choice.stop is not None and why["gamma_star"] <= choice.gamma == why["gamma"] <= 4 and why["stop"] == "calibrated"
    assert str(why["gamma_star"]) == max(why["pred_tok_s"], key=why["pred_tok_s"].get)  # the window's γ*, reported apart
    tree = OnlinePolicy(gamma=4, profile=profile)
    for v in (1, 0, 1, 1):
        tree.observe(Outcome(4, v, 4.0, 40.0, v + 1, 44.0, depth=2))  # a branching tree: its budget is not its depth
    assert tree.choose(DRAFTER, []).stop is None
    paper = OnlinePolicy(gamma=1, profile=profile, calibrated_stop=False)
    for v in (1, 0, 1, 1):
        paper.observe(event(1, v, verify_ms=31.0))
    assert paper.choose(DRAFTER, []).stop is None and paper.choose(DRAFTER, []).gamma == why["gamma_star"]
    assert not OnlinePolicy(gamma=1).calibrated_stop  # without a verify profile (a GPU) the draft stays on the device


def test_cache_fsm_jumps_on_a_repeated_suffix():
    p = make_policy("cache-fsm", 3)
    assert p.choose(DRAFTER, [1, 2, 3, 4, 5, 6]).gamma == 3
    choice = p.choose(DRAFTER, [1, 2, 3, 9, 1, 2, 3])
    assert choice.gamma == p.long_gamma and choice.why()["suffix_seen_before"]


def named(name: str) -> Drafter:
    d = Drafter()
    d.name = name
    return d


def test_selector_explores_then_exploits():
    a, b = named("a"), named("b")
    sel = OnlineSelector(explore=2)
    picks = []
    for _ in range(8):
        d = sel.choose([a, b], []).drafter
        picks.append(d.name if d else None)
        sel.observe(event(4, 4, drafter="b") if d is b else event(4, 0, drafter="a") if d else event(0, 0, drafter="target"))
    assert picks[:4].count("a") == 2 and picks[:4].count("b") == 2
    assert picks[4:] == ["b"] * 4  # then the better draft: no step is spent only to time the target


def test_selector_explores_the_predicted_best_first_and_shrinks_towards_the_prior():
    a, b = named("a"), named("b")
    sel = OnlineSelector(priors={"a": 0.2, "b": 0.6}, prior_weight=2.0)
    assert sel.choose([a, b], []).drafter.name == "b"
    sel.observe(event(4, 1, drafter="b"))  # censored MLE alone: 1 / (1 + 1) = 0.5
    assert sel.acceptance("b") == pytest.approx((1 + 2 * 0.6) / (2 + 2))
    assert sel.acceptance("a") == pytest.approx(0.2)  # no steps yet: the prior alone
    assert OnlineSelector().acceptance("a") is None


@pytest.mark.parametrize("accepted, explores_a", [(4, False), (0, True)])
def test_selector_explores_a_new_drafter_only_while_it_could_win(accepted, explores_a):
    a, b = named("a"), named("b")
    sel = OnlineSelector(priors={"a": 0.3, "b": 0.6}, prior_weight=2.0)
    sel.observe(event(0, 0, verify_ms=40.0, drafter="target"))
    sel.observe(event(4, accepted, draft_ms=5.0, verify_ms=40.0, drafter="b"))
    # a at its prior 0.3 with free drafting: at most (1 - 0.3^11) / 0.7 = 1.43 tokens per 40 ms = 35.7 tok/s.
    # b (5 ms per drafted token) after a full accept: Acc = (4 + 1.2) / (4 + 2) = 0.87, 63.9 tok/s at γ = 4;
    # after a full rejection: Acc = 1.2 / (1 + 2) = 0.4, at best 1.56 tokens per 50 ms = 31.2 tok/s (γ = 2)
    pick = sel.choose([a, b], [])
    assert pick.drafter.name == ("a" if explores_a else "b")
    assert pick.why()["reason"].startswith("exploring") == explores_a


def test_selector_pools_the_verify_cost_over_drafters():
    a, b = named("a"), named("b")
    sel = OnlineSelector()
    sel.observe(event(2, 2, verify_ms=30.0, drafter="a"))
    sel.observe(event(0, 0, verify_ms=20.0, drafter="b"))  # a plain target step still times the target
    sel.observe(event(4, 0, verify_ms=40.0, drafter="b"))
    assert sel.estimates.verify.verify_model() == VerifyCost({0: 20.0, 2: 30.0, 4: 40.0})
    # b's own steps: 0 of 4 accepted (MLE 0); a: 2 of 2 (capped at Acc_max); same verify model for both
    assert sel.predicted(a) > sel.predicted(b) > 0
    pick = sel.choose([a, b], [])
    assert pick.drafter.name == "a" and pick.why()["acc"] == {"a": 0.95, "b": 0.0}


def test_the_policy_reads_the_selectors_estimates_of_each_drafter():
    a, b = named("a"), named("b")
    sel = OnlineSelector(priors={"a": 0.3, "b": 0.6}, prior_weight=2.0)
    policy = PerDrafterPolicy(lambda: OnlinePolicy(gamma=2, estimates=sel.estimates))
    outcomes = [event(0, 0, verify_ms=20.0, drafter="target"), event(4, 3, draft_ms=2.0, verify_ms=30.0, drafter="a"),
                event(4, 4, draft_ms=2.0, verify_ms=30.0, drafter="b"), event(3, 1, draft_ms=2.0, verify_ms=28.0, drafter="a")]
    for outcome in outcomes:
        policy.choose(a, []), policy.choose(b, [])
        policy.observe(outcome)  # the policy hands every step over too: the estimates file it once
        sel.observe(outcome)
    assert len(sel.estimates.histories["a"].drafted()) == 2 and len(sel.estimates.verify.drafted()) == 3
    for d in (a, b):
        chosen = sel.choose([d], []).why()["acc"][d.name]
        assert policy.choose(d, []).why()["acc"] == chosen == sel.acceptance(d.name)


def test_selector_skips_an_ngram_drafter_without_a_match():
    model, ngram = named("m"), NGramDrafter()
    sel = OnlineSelector(explore=0)
    sel.observe(event(0, 0, drafter="target"))
    sel.observe(event(2, 2, drafter="ngram"))  # the n-gram drafter has the better record ...
    sel.observe(event(2, 1, drafter="m"))
    assert sel.choose([ngram, model], [1, 2, 3, 1, 2]).drafter.name == "ngram"
    pick = sel.choose([ngram, model], [1, 2, 3, 4, 5])
    assert pick.drafter.name == "m" and pick.why()["idle"] == ["ngram"]  # ... but no earlier match: it would propose nothing
    assert sel.choose([ngram], [1, 2, 3, 4, 5]).drafter is None  # nobody can propose: a plain step


def test_selector_takes_plain_steps_when_no_drafter_pays_and_probes():
    a = named("a")
    sel = OnlineSelector(explore=0, probe=4)
    first = sel.choose([a], [])  # nothing to explore and nothing measured: a plain step, which times the target
    assert first.drafter is None and first.why()["reason"] == "no drafter to explore: a plain step"
    sel.observe(event(0, 0, verify_ms=40.0, drafter="target"))
    sel.observe(event(3, 0, draft_ms=6.0, verify_ms=46.0, drafter="a"))  # never accepted: drafting only costs
    picks = []
    for _ in range(12):
        picks.append(sel.choose([a], []))
    assert [p.drafter is None for p in picks] == [True] * 3 + [False] + [True] * 7 + [False]  # the 4th probes, then the 8th after it
    assert picks[3].why()["reason"].startswith("probe") and picks[-1].why()["pred_tok_s"]["plain"] == pytest.approx(25.0)


def test_the_selector_prices_a_plain_step_from_the_profile_before_taking_one():
    """Before any plain step the selector prices one at the shortest verify measured (an upper bound); with the
    target's profile, at that verify times the profile's ratio, so it goes plain where drafting does not pay."""
    a = named("a")
    priced = {}
    for profile in (None, {0: 20.0, 1: 22.0, 2: 23.0, 3: 40.0}):
        sel = OnlineSelector(priors={"a": 0.15}, prior_weight=2.0, probe=64, profile=profile)
        sel.observe(event(3, 0, draft_ms=1.0, verify_ms=40.0, drafter="a"))  # acceptance (0 + 0.3) / (1 + 2) = 0.1
        pick = sel.choose([a], [])
        priced[profile is None] = pick.drafter is None, pick.why()["pred_tok_s"]["plain"]
    assert priced[True] == (False, pytest.approx(25.0))  # plain at 40 ms; γ 1 at 1.1 tokens per 41 ms: 26.8 tok/s
    assert priced[False] == (True, pytest.approx(50.0))  # plain at 40 · 20 / 40 ms; γ 1 at 1.1 per 1 + 40 · 22 / 40 ms: 47.8


def test_a_prepared_online_run_reads_the_targets_verify_profile(bank, monkeypatch, tmp_path):
    """Through prepare: the run measures the target's verify profile once (remembered in the cache directory) and its
    online policy prices every γ of it from the first drafted step on, not one γ beyond the longest verified."""
    from specviz.models.backends import cpu
    from specviz.runtime.config import DecodeConfig
    from specviz.runtime.prepare import prepare

    monkeypatch.setattr(cpu, "cache_dir", lambda: tmp_path)
    run = prepare(DecodeConfig(gamma=1, max_new_tokens=12), "Count from one to ten.", bank)
    events = list(run.events())
    assert (tmp_path / "verify_profile.json").exists()
    priced = [e.why["policy"]["b_p_ms"] for e in events if "b_p_ms" in e.why["policy"]]
    assert priced and all(set(b_p) == {str(g) for g in range(11)} for b_p in priced)
    fixed = prepare(DecodeConfig(gamma=1, gamma_policy="fixed", max_new_tokens=12), "Count from one to ten.", bank)
    assert [t for e in fixed.events() for t in e.emitted_ids] == [t for e in events for t in e.emitted_ids]


@pytest.mark.parametrize("name", sorted(GAMMA_POLICIES))
def test_every_policy_is_lossless(tiny_target, name):
    prompt = PROMPTS[1]
    events = list(decode(cached_model(tiny_target), prompt, drafters=[ModelDrafter(cached_model(tiny_target))],
                         policy=make_policy(name, 3), max_new_tokens=40))
    assert [t for e in events for t in e.emitted_ids] == reference(tiny_target, prompt, 40)


def test_selector_is_lossless(tiny_target, tiny_draft):
    prompt = PROMPTS[3]
    drafters = [ModelDrafter(cached_model(tiny_draft)), NGramDrafter(), ModelDrafter(cached_model(tiny_target))]
    events = list(decode(cached_model(tiny_target), prompt, drafters=drafters, policy=make_policy("online", 3),
                         selector=OnlineSelector(explore=2), max_new_tokens=40))
    assert [t for e in events for t in e.emitted_ids] == reference(tiny_target, prompt, 40)
    assert {e.drafter for e in events} >= {d.name for d in drafters}


def test_per_drafter_policy_learns_each_drafter_separately():
    policy = PerDrafterPolicy(lambda: FSMPolicy(4))
    a, b = SimpleNamespace(name="a"), SimpleNamespace(name="b")
    assert policy.choose(a, []).gamma == 4 and policy.choose(b, []).gamma == 4
    policy.observe(event(4, 4, drafter="a"))
    assert policy.choose(a, []).gamma == 5 and policy.choose(b, []).gamma == 4  # b never saw a's step
    assert policy.choose(a, []).why()["policy"] == policy.name == "fsm"


def test_per_drafter_online_policies_share_the_targets_timing():
    """A plain step taken for one drafter (or by the selector) times the target for every drafter's policy,
    so each does not spend a plain step of its own to learn what the others already measured."""
    policy = PerDrafterPolicy(lambda: make_policy("online", 3))
    a, b = SimpleNamespace(name="a"), SimpleNamespace(name="b")
    for drafter in (a, b):
        assert policy.choose(drafter, []).gamma == 3  # no history: the initial γ
        policy.observe(event(3, 2, drafter=drafter.name))
    assert policy.choose(b, []).why()["b_p_ms"]["0"] == 40.0  # no plain step yet: priced at the shortest verify
    policy.observe(event(0, 0, verify_ms=30.0, drafter="a"))
    assert policy.choose(b, []).why()["b_p_ms"]["0"] == 30.0  # b learnt the plain cost from a's plain step
    policy.observe(event(0, 0, drafter="target"))  # the selector's plain step reaches every policy
    assert all(len(p.estimates.verify.costs[0]) == 2 for p in policy.policies.values())
    c = SimpleNamespace(name="c")
    policy.choose(c, [])  # a policy built later learns from the steps before it
    assert len(policy.policies["c"].estimates.verify.costs[0]) == 2
