"""The polybasic theory functions against hand computations and simulation."""

import random

import pytest

from specviz.analysis.theory import acceptance_mle, break_even_length, insertion_helps, lemma_time
from specviz.core.formulas import capped_geometric_moments, capped_geometric_pmf


@pytest.mark.parametrize("a, m", [(0.0, 1), (0.3, 2), (0.7, 5), (0.95, 9)])
def test_theorem_3_3_moments_match_the_pmf(a, m):
    pmf = capped_geometric_pmf(a, m)
    mean, second = capped_geometric_moments(a, m)
    assert sum(pmf) == pytest.approx(1)
    assert mean == pytest.approx(sum((i + 1) * p for i, p in enumerate(pmf)))
    assert second == pytest.approx(sum((i + 1) ** 2 * p for i, p in enumerate(pmf)))


def test_theorem_3_3_matches_simulated_lengths():
    rng, a, k = random.Random(0), 0.6, 4
    lengths = []
    for _ in range(20000):
        n = 0
        while n < k and rng.random() < a:
            n += 1
        lengths.append(n + 1)
    mean, second = capped_geometric_moments(a, k + 1)
    assert sum(lengths) / len(lengths) == pytest.approx(mean, rel=0.02)
    assert sum(x * x for x in lengths) / len(lengths) == pytest.approx(second, rel=0.03)


def test_acceptance_mle_recovers_the_rate_from_censored_verifications():
    rng, a = random.Random(1), 0.8
    pairs = []
    for _ in range(5000):
        k = rng.randint(1, 4)
        n = 0
        while n < k and rng.random() < a:
            n += 1
        pairs.append([k, n + 1])
    assert acceptance_mle(pairs) == pytest.approx(a, abs=0.02)
    assert acceptance_mle([[0, 1], [0, 1]]) is None


def test_lemma_3_1_by_hand():
    # AR: N forwards of the target
    assert lemma_time(10, [50.0], [1.0], 0.0) == pytest.approx(500)
    # two models: N/L target forwards plus β draft passes per verification
    assert lemma_time(12, [50.0, 5.0], [3.0], 4.0) == pytest.approx(12 / 3 * 50 + 4 * 12 / 3 * 5)
    # three models: the middle level's forwards count with its own L
    assert lemma_time(12, [50.0, 10.0, 1.0], [4.0, 2.0], 3.0) == pytest.approx(12 / 4 * 50 + 12 / 2 * 10 + 3 * 12 / 2 * 1)


def test_theorem_3_2_and_its_break_even_agree():
    t_new, t_i, l_new, l_after = 10.0, 50.0, 2.0, 3.0
    edge = break_even_length(t_new, t_i, l_new, l_after)
    assert insertion_helps(t_new, t_i, l_new, edge * 0.99, l_after)
    assert not insertion_helps(t_new, t_i, l_new, edge * 1.01, l_after)
    # a free, perfect helper that does not change L_i cannot help
    assert not insertion_helps(0.0, t_i, l_new, l_after, l_after)
