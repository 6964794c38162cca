"""The chain advisor's ranking: every speed-ordered chain, scored by Lemma 3.1 from measured pairs."""

import pytest

from specviz.analysis.advisor import TARGET, Pair, candidate_chains, chain_label, predicted_tokens_per_s


def test_candidate_chains_keep_speed_order_and_include_ar_and_plain_sd():
    chains = candidate_chains(["ngram", "s", "m", TARGET])
    assert [] in chains and ["ngram"] in chains and ["s"] in chains and ["m"] in chains
    assert ["ngram", "s", "m"] in chains and ["s", "m"] in chains
    assert ["m", "s"] not in chains and all(c.count("ngram") <= 1 and ("ngram" not in c or c[0] == "ngram") for c in chains)
    assert len(chains) == 8
    assert chain_label([]) == "ar" and chain_label(["ngram", "s"]) == "ngram→s→target"


def test_predicted_throughput_by_hand():
    pairs = {(TARGET, None): Pair(50.0, 0.0, 1.0), (TARGET, "s"): Pair(60.0, 5.0, 2.0), (TARGET, "ngram"): Pair(60.0, 0.1, 1.5),
             ("s", "ngram"): Pair(6.0, 0.1, 1.2)}
    assert predicted_tokens_per_s([], pairs, 4) == pytest.approx(1e3 / 50)
    assert predicted_tokens_per_s(["s"], pairs, 4) == pytest.approx(1e3 / (60 / 2 + 4 * 5 / 2))
    assert predicted_tokens_per_s(["ngram"], pairs, 4) == pytest.approx(1e3 / (60 / 1.5 + 0.1 / 1.5))
    # three levels: target verifies s's blocks, s verifies the n-gram drafts (one lookup per verification)
    assert predicted_tokens_per_s(["ngram", "s"], pairs, 4) == pytest.approx(1e3 / (60 / 2 + 6 / 1.2 + 0.1 / 1.2))
