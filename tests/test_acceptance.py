"""The sampling acceptance rule reproduces the target distribution (chi-square, fixed seeds)."""

import pytest
import torch

from specviz.core.acceptance import ExactRule, LenientRule, TopKRule, residual
from specviz.core.drafters import Draft, ModelDrafter
from specviz.core.engine import decode
from specviz.core.hidden import prenorm_states
from specviz.core.policy import FixedPolicy
from specviz.core.sampling import Sampler, top_p_filter
from specviz.methods.judge import JudgeHead, JudgeRule
from specviz.models.backends import cached_model
from tests.conftest import chi_square_p, seeded

V = 6




def normalised(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum(-1, keepdim=True)


def first_token_counts(p: torch.Tensor, q_true: torch.Tensor, q_told: torch.Tensor, n: int, gamma: int = 2) -> torch.Tensor:
    """Draft γ tokens from q_true, verify as if they came from q_told; count the first emitted token."""
    sampler = Sampler(temperature=1.0, seed=123)
    rule, counts = ExactRule(), torch.zeros(V)
    logits = p.log()
    for _ in range(n):
        ids = [int(torch.multinomial(q_true[i], 1, generator=sampler.generator)) for i in range(gamma)]
        verdict = rule.verify(Draft(ids, q_told[:gamma], "synthetic"), logits, sampler)
        first = ids[0] if verdict.accepted > 0 else verdict.next_token
        counts[first] += 1
    return counts


def test_residual():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(residual(p, p), p)


def test_exact_rule_reproduces_target_distribution():
    g = seeded(0)
    p = normalised(torch.rand(3, V, generator=g) ** 3)
    q = normalised(torch.rand(3, V, generator=g) ** 3)
    n = 6000
    counts = first_token_counts(p, q, q, n)
    assert chi_square_p(counts, n * p[0]) > 1e-3


def test_wrong_q_is_detected():
    """The bug transformers once had: verifying with a q other than the one sampled from biases output."""
    g = seeded(0)
    p = normalised(torch.rand(3, V, generator=g) ** 3)
    q = normalised(torch.rand(3, V, generator=g) ** 3)
    q_wrong = normalised(q ** 2)  # e.g. the draft's distribution before the temperature transform
    n = 6000
    counts = first_token_counts(p, q, q_wrong, n)
    assert chi_square_p(counts, n * p[0]) < 1e-6


def test_top_p_keeps_nucleus():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    assert torch.allclose(top_p_filter(probs, 0.7), torch.tensor([2 / 3, 1 / 3, 0, 0]))
    assert torch.allclose(top_p_filter(probs, 1.0), probs)


def exact_two_token_joint(lm, prompt, temperature, top_p):
    """P(t1, t2) of the target alone under the sampling transform, computed exactly over the tiny vocab."""
    sampler = Sampler(temperature=temperature, top_p=top_p)
    with torch.inference_mode():
        p1 = sampler.probs(lm.model(torch.tensor([prompt])).logits[0, -1])
        seqs = torch.tensor([prompt + [t] for t in range(lm.vocab_size)])
        p2 = sampler.probs(lm.model(seqs).logits[:, -1])
    return p1[:, None] * p2


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_speculative_sampling_matches_target_on_a_model(small_vocab_pair, temperature, top_p):
    target, draft = small_vocab_pair
    prompt = [3, 1, 4]
    joint = exact_two_token_joint(target, prompt, temperature, top_p).flatten()
    counts = torch.zeros_like(joint)
    n = 1500
    for seed in range(n):
        events = decode(cached_model(target), prompt, drafters=[ModelDrafter(cached_model(draft))],
                        policy=FixedPolicy(3), sampler=Sampler(temperature, top_p, seed), max_new_tokens=2)
        t1, t2 = [t for e in events for t in e.emitted_ids][:2]
        counts[t1 * target.vocab_size + t2] += 1
    keep = joint * n >= 5  # chi-square needs populated cells; pool the rest (top-p leaves some at exactly 0)
    observed, expected = counts[keep], joint[keep] * n
    if joint[~keep].sum() > 0:
        observed = torch.cat([observed, counts[~keep].sum(0, keepdim=True)])
        expected = torch.cat([expected, joint[~keep].sum(0, keepdim=True) * n])
    assert counts[joint == 0].sum() == 0  # never a token the target could not produce
    assert len(observed) >= 5  # enough cells for the test to have power
    assert chi_square_p(observed, expected) > 1e-3


def RandomHead(hidden: int, bias: float = 0.0, scale: float = 1.0, confidence: bool = False) -> JudgeHead:
    """A judge head with a fixed random weight (and, with ``confidence``, weights on the two confidence features)."""
    w = scale * torch.randn(hidden + 2 * confidence, generator=seeded(0))
    return JudgeHead(w, bias, "tiny", hidden, confidence=confidence)


def relaxed_run(target, draft, rule, temperature, seed=0, n=24):
    verifier = cached_model(target, taps=rule.reads_layers(target.model.config.num_hidden_layers))
    events = list(decode(verifier, [5, 17, 3, 9], drafters=[ModelDrafter(cached_model(draft))],
                         rule=rule, policy=FixedPolicy(4), sampler=Sampler(temperature, 1.0, seed), max_new_tokens=n))
    return [t for e in events for t in e.emitted_ids], events


SWITCHED_OFF = [(lambda h: JudgeRule(RandomHead(h), 1.0), 0.0), (lambda h: JudgeRule(RandomHead(h), 1.0), 1.0),
                (lambda h: LenientRule(1.0), 0.0), (lambda h: LenientRule(1.0), 1.0),
                (lambda h: TopKRule(1), 0.0)]  # top-1 is the exact rule only when greedy


@pytest.mark.parametrize("make_rule, temperature", SWITCHED_OFF)
def test_relaxed_rules_switched_off_reproduce_exact(tiny_target, tiny_draft, make_rule, temperature):
    rule = make_rule(tiny_target.model.config.hidden_size)
    for seed in range(3):
        exact, _ = relaxed_run(tiny_target, tiny_draft, ExactRule(), temperature, seed)
        relaxed, events = relaxed_run(tiny_target, tiny_draft, rule, temperature, seed)
        assert relaxed == exact
        assert all(r in ("exact", "rejected", "unchecked") for e in events for r in e.accept_reasons)


@pytest.mark.parametrize("confidence", [False, True])
def test_judge_scores_come_from_the_verify_pass(tiny_target, tiny_draft, confidence):
    """Scores are the head on the target's pre-norm state where the draft token is the input (and, with
    confidence features, on the target's log p of the draft token from the row that predicted it)."""
    head = RandomHead(tiny_target.model.config.hidden_size, confidence=confidence)
    _, events = relaxed_run(tiny_target, tiny_draft, JudgeRule(head, 0.5), 0.0)
    tokens = [5, 17, 3, 9]
    assert any(e.draft_ids for e in events)
    for e in events:
        if e.draft_ids:
            states = prenorm_states(tiny_target.model, tokens + e.draft_ids)
            with torch.inference_mode():
                logits = tiny_target.model(torch.tensor([tokens + e.draft_ids])).logits[0]
            n, g = len(tokens), len(e.draft_ids)
            x = head.inputs(states[n: n + g], logits[n - 1: n + g - 1], torch.tensor(e.draft_ids))
            assert e.scores.scores == pytest.approx(head.score(x).tolist(), abs=1e-4) and e.scores.threshold == 0.5
            kept = [r for r in e.accept_reasons if r in ("exact", "judge")]
            assert all(s > 0.5 for s, r in zip(e.scores.scores, kept) if r == "judge")
        tokens += e.emitted_ids


def test_judge_that_accepts_everything_keeps_every_draft(tiny_target, tiny_draft):
    always = RandomHead(tiny_target.model.config.hidden_size, bias=5.0, scale=0.0)
    _, events = relaxed_run(tiny_target, tiny_draft, JudgeRule(always, 0.5), 0.0)
    assert all(e.accepted == len(e.draft_ids) for e in events)
    assert any("judge" in e.accept_reasons for e in events)


def test_topk_accepts_within_the_targets_top_k():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 3.0, 2.0], [0.0, 1.0, 0.5, 5.0]])  # no ties: topk breaks them by device
    verdict = TopKRule(2).verify(Draft([1, 3, 0], None, "d"), torch.cat([logits, logits[:1]]), Sampler())
    assert verdict.accepted == 2 and verdict.reasons == ["topk", "topk", "rejected"] and verdict.next_token == 3


def test_greedy_lenience_accepts_near_ties():
    logits = torch.tensor([[2.0, 1.9, -3.0], [0.0, 0.0, 0.0]]).log_softmax(-1)
    draft = Draft([1], None, "d")
    assert LenientRule(1.0).verify(draft, logits, Sampler()).accepted == 0
    assert LenientRule(0.8).verify(draft, logits, Sampler()).reasons == ["lenient"]


@pytest.mark.parametrize("rule", [ExactRule(), TopKRule(2), LenientRule(0.5)], ids=lambda r: r.name)
@pytest.mark.parametrize("hits", [0, 2, 3])
def test_greedy_verification_reads_the_device_once(host_reads, rule, hits):
    logits = torch.randn(4, V, generator=seeded(hits))
    best = logits.argmax(-1).tolist()
    ids = best[:hits] + [(b + 1) % V for b in best[hits:3]]
    host_reads[0] = 0
    verdict = rule.verify(Draft(ids, None, "d"), logits, Sampler())
    assert host_reads[0] == 1
    assert verdict.accepted >= hits and verdict.path == list(range(verdict.accepted))
    if rule.name == "exact":
        assert verdict.accepted == hits and verdict.next_token == best[hits]


def test_greedy_tree_verification_reads_the_device_once(host_reads):
    logits = torch.randn(5, V, generator=seeded(0))
    best = logits.argmax(-1).tolist()
    draft = Draft([(best[0] + 1) % V, best[0], best[2], (best[3] + 1) % V], None, "d", parents=[-1, -1, 1, 2])
    host_reads[0] = 0
    verdict = ExactRule().verify(draft, logits, Sampler())
    assert host_reads[0] == 1 and verdict.path == [1, 2] and verdict.next_token == best[3]
    assert verdict.reasons == ["rejected", "exact", "exact", "rejected"]


def test_an_empty_draft_reads_the_device_once(host_reads):
    logits = torch.randn(1, V, generator=seeded(1))
    expected = int(logits[0].argmax())
    host_reads[0] = 0
    verdict = ExactRule().verify(Draft([], None, "target"), logits, Sampler())
    assert host_reads[0] == 1 and verdict.next_token == expected
