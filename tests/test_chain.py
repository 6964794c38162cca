"""Polybasic chains: greedy exactness against transformers' generate, exact sampling, per-level reports."""

import pytest
import torch

from specviz.analysis.theory import run_theory
from specviz.core.drafters import SINGLE_PATH, ModelDrafter, NGramDrafter
from specviz.core.engine import decode
from specviz.core.policy import FixedPolicy
from specviz.core.sampling import Sampler
from specviz.methods.chain import StagedDrafter, build_chain
from specviz.methods.policies import make_policy
from specviz.models.backends import cached_model
from tests.conftest import chi_square_p, tiny_llama
from tests.test_acceptance import exact_two_token_joint
from tests.test_engine import PROMPTS, reference


@pytest.fixture(scope="module")
def tiny_middle():
    return tiny_llama(vocab=96, hidden=48, layers=1, seed=2, init_std=0.2)


def chain_of(kind: str, target, draft, middle, level_gamma: int):
    verifiers = {"ngram→draft": [draft], "draft→middle": [middle], "ngram→draft→middle": [draft, middle],
                 "draft→target-copy": [target]}[kind]
    bottom = NGramDrafter() if kind.startswith("ngram") else ModelDrafter(cached_model(draft))
    return build_chain(bottom, [cached_model(v) for v in verifiers], level_gamma)


def run_chain(target, drafter, prompt, n, policy, sampler=None):
    events = list(decode(cached_model(target), prompt, drafters=[drafter], policy=policy, sampler=sampler or Sampler(), max_new_tokens=n))
    return [t for e in events for t in e.emitted_ids], events


@pytest.mark.parametrize("mu", [1, 3, 6])
@pytest.mark.parametrize("kind", ["ngram→draft", "draft→middle", "ngram→draft→middle"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_chain_matches_generate(tiny_target, tiny_draft, tiny_middle, kind, mu, prompt):
    drafter = chain_of(kind, tiny_target, tiny_draft, tiny_middle, level_gamma=2)
    out, events = run_chain(tiny_target, drafter, prompt, 40, FixedPolicy(mu))
    assert out == reference(tiny_target, prompt, 40)
    assert all(len(e.draft_ids) <= e.gamma for e in events)


@pytest.mark.parametrize("policy", ["fsm", "online", "hf-heuristic", "confidence", "rl", "cache-fsm"])
def test_chain_with_every_length_policy_is_lossless(tiny_target, tiny_draft, tiny_middle, policy):
    prompt = PROMPTS[1]
    out, _ = run_chain(tiny_target, chain_of("ngram→draft→middle", tiny_target, tiny_draft, tiny_middle, 3), prompt, 40,
                       make_policy(policy, 4))
    assert out == reference(tiny_target, prompt, 40)


def test_chain_of_target_copies_accepts_whole_blocks(tiny_target, tiny_draft):
    """A verifier identical to the target: the target accepts every block the verifier hands up."""
    out, events = run_chain(tiny_target, chain_of("draft→target-copy", tiny_target, tiny_draft, None, 2), PROMPTS[0], 30,
                            FixedPolicy(5))
    assert out == reference(tiny_target, PROMPTS[0], 30)
    assert all(e.accepted == len(e.draft_ids) for e in events)


def test_levels_report_the_work_of_each_model(tiny_target, tiny_draft, tiny_middle):
    drafter = chain_of("ngram→draft→middle", tiny_target, tiny_draft, tiny_middle, 2)
    _, events = run_chain(tiny_target, drafter, PROMPTS[1], 40, FixedPolicy(6))
    events = [e for e in events if e.draft_ids]  # the last step may be too short to draft
    names = [[rec.name for rec in e.levels] for e in events]
    assert all(n == [tiny_middle.name, tiny_draft.name, "ngram"] for n in names)
    middle = [v for e in events for v in e.levels[0].verifications]
    # what the middle level passed up is exactly what the target was asked to verify
    assert sum(up for _, up in middle) == sum(len(e.draft_ids) for e in events)
    assert all(1 <= up <= k + 1 for k, up in middle)
    assert sum(e.levels[0].passes for e in events) == len(middle)
    theory = run_theory(events)
    assert [lv["name"] for lv in theory["levels"]] == ["target", tiny_middle.name, tiny_draft.name, "ngram"]
    assert len(theory["insertions"]) == 2
    assert theory["predicted_tokens_per_s"] > 0 and theory["measured_tokens_per_s"] > 0


def test_staged_drafter_block_never_exceeds_mu(tiny_target, tiny_draft):
    drafter = StagedDrafter(ModelDrafter(cached_model(tiny_draft)), cached_model(tiny_target), level_gamma=4)
    for mu in range(1, 8):
        draft = drafter.draft(PROMPTS[0], mu, mu, SINGLE_PATH, Sampler())
        assert 1 <= len(draft.ids) <= mu and draft.q.shape == (len(draft.ids), tiny_target.vocab_size)


@pytest.mark.slow
def test_chain_sampling_matches_target_distribution(small_vocab_pair):
    """Two-token joint of a three-model chain (bottom → middle → target) against the target's exact joint."""
    target, draft = small_vocab_pair
    bottom = tiny_llama(vocab=10, hidden=16, layers=1, seed=5, init_std=0.3)
    prompt, n = [3, 1, 4], 1500
    joint = exact_two_token_joint(target, prompt, 1.0, 1.0).flatten()
    counts = torch.zeros_like(joint)
    for seed in range(n):
        chain = build_chain(ModelDrafter(cached_model(bottom)), [cached_model(draft)], level_gamma=2)
        out, _ = run_chain(target, chain, prompt, 2, FixedPolicy(3), Sampler(1.0, 1.0, seed))
        counts[out[0] * target.vocab_size + out[1]] += 1
    keep = joint * n >= 5
    observed = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    expected = torch.cat([joint[keep], joint[~keep].sum(0, keepdim=True)]) * n
    assert chi_square_p(observed, expected) > 1e-3
