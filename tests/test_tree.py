"""Token trees: greedy tree decoding equals transformers' generate for every drafter, budget and kind, on the lean
path (growing and fixed-capacity caches) and on transformers' own forward; sampled trees keep the target's
distribution (and a deterministic top-k tree, verified the same way, does not); every step records a well-formed tree
whose decisions recompute from its records."""

import copy
import re

import pytest
import torch

from specviz.core.acceptance import ExactRule
from specviz.core.cache import CachedModel
from specviz.core.drafters import SINGLE_PATH, Draft, ModelDrafter, NGramDrafter
from specviz.core.engine import decode
from specviz.core.policy import FixedPolicy
from specviz.core.sampling import Sampler
from specviz.core.tree import MAX_TREE_NODES, TokenTree, TreeShape, ancestry, depths, grow_tree
from specviz.methods.chain import build_chain
from specviz.methods.feature_head import FeatureDrafter
from specviz.models.backends import cached_model
from specviz.models.backends.graphs import eager_capture
from specviz.models.backends.lean import LeanStorage

from .conftest import chi_square_p, seeded
from .test_acceptance import exact_two_token_joint, normalised
from .test_eagle3 import HEADS as EAGLE3_HEADS
from .test_eagle3 import drafter_for, heads, target_models, targets  # noqa: F401  (fixtures)
from .test_engine import PROMPTS, Pieces, a_stop_among_accepted_drafts, reference
from .test_feature_head import random_head

REPEATS = [1, 2, 3, 1, 2, 4, 1, 2, 5, 7, 1, 2, 3, 9, 1, 2]  # the suffix [1, 2] was followed by 3, 4 and 5


def run_tree(target, drafter, nodes, kind="dynamic", branch=2, prompt=PROMPTS[0], n=30, sampler=None):
    return list(decode(target, prompt, drafters=[drafter], policy=FixedPolicy(nodes), sampler=sampler or Sampler(),
                       max_new_tokens=n, tree=TreeShape(branch, kind)))


def emitted(events):
    return [t for e in events for t in e.emitted_ids]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("make", ["model", "self", "ngram"])
def test_a_chain_and_a_single_path_tree_give_identical_steps(tiny_target, tiny_draft, make, temperature):
    """A chain is the tree of branch 1: drafted, verified and recorded alike, token for token and record for record."""
    def steps(shape):
        drafter = {"model": lambda: ModelDrafter(cached_model(tiny_draft)), "self": lambda: ModelDrafter(cached_model(tiny_target)),
                   "ngram": NGramDrafter}[make]()
        return list(decode(cached_model(tiny_target), PROMPTS[2] * 2, drafters=[drafter], policy=FixedPolicy(3),
                           sampler=Sampler(temperature, 1.0, seed=5), max_new_tokens=30, tree=shape))

    chain, tree = steps(SINGLE_PATH), steps(TreeShape(1, "dynamic"))
    assert sum(e.drafted for e in chain) > 10 and (make != "self" or sum(e.accepted for e in chain) > 10)
    kept = ("drafter", "gamma", "drafted", "draft_ids", "draft_q", "draft_p", "accepted", "emitted_ids", "emitted_p",
            "accept_reasons", "judge_scores", "why", "verify", "extra")
    for a, b in zip(chain, tree, strict=True):
        da, db = a.to_dict(), b.to_dict()
        assert {k: da[k] for k in kept if k != "extra"} == {k: db[k] for k in kept if k != "extra"}
        assert da["spans"].keys() == db["spans"].keys() and da.keys() == db.keys() and not b.tree.branching


def check_tree(event, nodes):
    """A well-formed tree: parents before children, the accepted path a root-down branch whose tokens come first."""
    tree, ids = event.tree, event.draft_ids
    if not tree.branching:  # a single path drafted under a tree's shape: recorded as a chain's step is
        assert event.checked and len(ids) <= event.gamma <= nodes
        return
    parents, path = tree.parents, tree.accepted_path
    assert len(parents) == len(ids) == len(event.nodes) <= event.gamma <= nodes
    assert all(-1 <= parent < i for i, parent in enumerate(parents))
    assert [parents[i] for i in path] == ([-1] + path[:-1])[: len(path)]
    assert event.emitted_ids[: len(path)] == [ids[i] for i in path] and len(event.emitted_ids) <= len(path) + 1
    assert event.accepted == len(path)
    siblings = {}
    for i, parent in enumerate(parents):
        siblings.setdefault(parent, []).append(ids[i])
    assert all(len(set(kids)) == len(kids) for kids in siblings.values())  # children are drawn without replacement
    for i, node in enumerate(event.nodes):
        assert (node.token, node.parent) == (ids[i], parents[i])
        assert node.accepted == (True if i in path else node.accepted)
        if node.u is not None:  # sampled: the decision recomputes from the record
            assert node.accepted == (node.u * node.q < node.p)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("nodes", [1, 4, 8])
@pytest.mark.parametrize("which", ["other", "self", "ngram"])
@pytest.mark.parametrize("prompt", [PROMPTS[0], REPEATS])
def test_greedy_trees_match_generate(tiny_target, tiny_draft, which, nodes, kind, prompt):
    drafter = {"other": lambda: ModelDrafter(cached_model(tiny_draft)), "self": lambda: ModelDrafter(cached_model(tiny_target)),
               "ngram": NGramDrafter}[which]()
    events = run_tree(cached_model(tiny_target), drafter, nodes, kind, prompt=prompt)
    assert emitted(events) == reference(tiny_target, prompt, 30)
    for e in events:
        if e.draft_ids:
            check_tree(e, nodes)
    if which == "self":  # the draft is the target: the root's first child chain is always accepted
        assert all(e.accepted >= 1 for e in events[:-1])


def test_ngram_offers_every_continuation_the_text_has(tiny_target):
    events = run_tree(cached_model(tiny_target), NGramDrafter(), 6, branch=3, prompt=REPEATS, n=2)
    first = events[0]
    roots = [t for t, parent in zip(first.draft_ids, first.tree.parents) if parent == -1]
    assert sorted(roots) == [3, 4, 5]


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_transformers_forward_takes_the_tree_mask(tiny_target, tiny_draft, kind):
    """transformers' own forward (DynamicCache, a custom 4D mask and position ids) for both models."""
    events = run_tree(CachedModel(tiny_target), ModelDrafter(CachedModel(tiny_draft)), 6, kind, prompt=PROMPTS[3])
    assert emitted(events) == reference(tiny_target, PROMPTS[3], 30)


def test_fixed_capacity_caches_keep_static_shapes(tiny_target, tiny_draft):
    """A GPU run's caches: fixed capacity (room for the tree's slots), forwards recorded (eagerly here)."""
    prompt, n, nodes = PROMPTS[1], 30, 6
    capacity = len(prompt) + n + 1 + nodes
    target = CachedModel(tiny_target, storage=LeanStorage(tiny_target, 96, capacity=capacity, capture=eager_capture), taps=(1,))
    head = FeatureDrafter(random_head(tiny_target, 3), target, None, capacity=capacity, capture=eager_capture)
    assert emitted(run_tree(target, head, nodes, prompt=prompt, n=n)) == reference(tiny_target, prompt, n)
    assert target.storage.stack.graphs.recorded and head.stack.graphs.recorded


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("nodes", [3, 8])
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_feature_head_trees_match_generate(tiny_target, nodes, kind, prompt):
    target = cached_model(tiny_target, taps=(0, 1))
    events = run_tree(target, FeatureDrafter(random_head(tiny_target, 1, (0, 1)), target, None), nodes, kind, prompt=prompt)
    assert emitted(events) == reference(tiny_target, prompt, 30)
    assert sum(len(e.draft_ids) for e in events) > 10


@pytest.mark.parametrize("make", ["model", "head"])
def test_a_greedy_trees_first_children_are_the_chain_draft(tiny_target, tiny_draft, make):
    """Down the first child of every node, a greedy dynamic tree is the drafter's own chain: the tree mask and positions
    of the drafting forwards are right."""
    target = cached_model(tiny_target, taps=(0, 1))
    drafter = ModelDrafter(cached_model(tiny_draft)) if make == "model" else \
        FeatureDrafter(random_head(tiny_target, 2, (0, 1)), target, None)
    tokens = PROMPTS[3]
    drafter.read_states(0, target.forward(tokens, keep=1).layers)  # the target's states of every position (a model draft ignores them)
    tree = drafter.draft(tokens, 12, 6, TreeShape(2, "static"), Sampler())
    chain = [tree.ids[i] for i in range(0, len(tree.ids), 2)]  # static: two chains, nodes interleaved level by level
    assert chain == drafter.draft(tokens, 6, 6, SINGLE_PATH, Sampler()).ids


def test_one_token_prompt_drafts_an_empty_tree_first(tiny_target):
    target = cached_model(tiny_target, taps=(1,))
    events = run_tree(target, FeatureDrafter(random_head(tiny_target), target, None), 4, prompt=[42], n=10)
    assert events[0].draft_ids == [] and emitted(events) == reference(tiny_target, [42], 10)


def test_tree_helpers():
    parents = [-1, -1, 0, 0, 2]
    assert depths(parents) == [1, 1, 2, 2, 3]
    assert ancestry(parents)[4].tolist() == [True, False, True, False, True]


V = 6


def synthetic(seed):
    """A root distribution and one per token for the next position, for p and for q."""
    g = seeded(seed)
    p1, q1 = normalised(torch.rand(V, generator=g) ** 3), normalised(torch.rand(V, generator=g) ** 3)
    return p1, q1, normalised(torch.rand(V, V, generator=g) ** 3), normalised(torch.rand(V, V, generator=g) ** 3)


def first_token_counts(build, n, seed=0):
    """Verify n trees (``build(q1, q2, sampler)``) against a synthetic target; count the first emitted token."""
    p1, q1, p2, q2 = synthetic(seed)
    sampler, counts = Sampler(temperature=1.0, seed=seed), torch.zeros(V)
    for _ in range(n):
        tree, q = build(q1, q2, sampler)
        p = torch.stack([p1] + [p2[t] for t in tree.ids])
        verdict = ExactRule().verify(Draft(tree.ids, q, "d", parents=tree.parents), p.log(), sampler)
        counts[tree.ids[verdict.path[0]] if verdict.path else verdict.next_token] += 1
    return counts, p1


def drafted(kind, nodes=4, branch=3, stop=None):
    def build(q1, q2, sampler):
        expand = lambda feed: (q2[feed.ids] if feed.ids else q1[None]).log()  # noqa: E731
        grown = grow_tree(expand, TreeShape(branch, kind), nodes, 3, sampler, stop)
        return grown.tree, grown.q
    return build


@pytest.mark.parametrize("shape", [SINGLE_PATH, TreeShape(3, "dynamic"), TreeShape(3, "static")])
def test_a_stop_rule_ends_a_path_after_the_token_it_reads_in_every_shape(shape):
    """The confidence policy's stop rule is the drafter's for chains and trees alike: it reads the draft probabilities of
    a node's path as the node is drawn, and a node it stops stays in the draft without children."""
    _, q1, _, q2 = synthetic(1)
    expand = lambda feed: (q2[feed.ids] if feed.ids else q1[None]).log()  # noqa: E731
    free = grow_tree(expand, shape, 12, 6, Sampler())
    drawn = [float((q1 if parent < 0 else q2[free.tree.ids[parent]])[t]) for t, parent in zip(free.tree.ids, free.tree.parents)]
    threshold = max(drawn)  # every node of the free tree but its likeliest would be stopped: whatever the draws, a cut
    seen = []

    def stop(path):
        seen.append(list(path))
        return path[-1] < threshold

    grown = grow_tree(expand, shape, 12, 6, Sampler(), stop)
    tree = grown.tree
    assert free.confidence is None and tree.ids and tree != free.tree
    parent_q = [q1 if parent < 0 else q2[tree.ids[parent]] for parent in tree.parents]
    assert grown.confidence == pytest.approx([float(q[t]) for q, t in zip(parent_q, tree.ids)])  # each token's own q
    assert all(grown.confidence[parent] >= threshold for parent in tree.parents if parent >= 0)
    assert all(path[:-1] in seen or len(path) == 1 for path in seen)  # a path grows by the token just drawn
    first = grow_tree(expand, shape, 12, 6, Sampler(), lambda path: True).tree  # every first-level node stopped
    assert first.ids == free.tree.ids[: shape.branch] and first.parents == [-1] * shape.branch


@pytest.mark.parametrize("shape", [SINGLE_PATH, TreeShape(3, "dynamic")])
def test_a_stop_rule_draws_no_more_than_it_keeps(shape):
    """Stopping reads the token just drawn, so a stopped draft asks the drafter for no forward past its last node."""
    _, q1, _, q2 = synthetic(1)
    calls = []

    def expand(feed):
        calls.append(len(feed.ids))
        return (q2[feed.ids] if feed.ids else q1[None]).log()

    tree = grow_tree(expand, shape, 12, 6, Sampler(), lambda path: len(path) >= 2).tree
    assert max(depths(tree.parents)) == 2 and len(calls) == 2  # the root's forward and the first level's


def deterministic_top_k(q1, q2, sampler, k=3):
    """The broken variant: the root's k most likely draft tokens as children, verified by the same recursive rule."""
    ids = q1.topk(k).indices.tolist()
    stages = q1.expand(k, -1).clone()
    for j in range(1, k):
        stages[j:, ids[j - 1]] = 0
    return TokenTree(ids, [-1] * k), stages / stages.sum(-1, keepdim=True)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_sampled_trees_keep_the_target_distribution(kind):
    n = 6000
    counts, p1 = first_token_counts(drafted(kind), n)
    assert chi_square_p(counts, n * p1) > 1e-3


@pytest.mark.parametrize("kind", ["single-path", "dynamic", "static"])
def test_sampled_drafts_cut_by_a_stop_rule_keep_the_target_distribution(kind):
    """A stop rule decides from the draft's own draws only, so the output stays the target's."""
    n = 6000
    branch = 1 if kind == "single-path" else 3
    counts, p1 = first_token_counts(drafted(kind, nodes=4, branch=branch, stop=lambda path: path[-1] < 0.3), n)
    assert chi_square_p(counts, n * p1) > 1e-3


def test_deterministic_top_k_children_are_not_exact():
    n = 6000
    counts, p1 = first_token_counts(deterministic_top_k, n)
    assert chi_square_p(counts, n * p1) < 1e-6


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_sampled_tree_decoding_matches_the_target_on_a_model(small_vocab_pair, kind):
    """Two tokens from the engine with tree drafts (T = 0.8, top-p 0.95): their joint is the target's."""
    target, draft = small_vocab_pair
    prompt = [3, 1, 4]
    joint = exact_two_token_joint(target, prompt, 0.8, 0.95).flatten()
    counts = torch.zeros_like(joint)
    n = 1200
    for seed in range(n):
        events = run_tree(cached_model(target), ModelDrafter(cached_model(draft)), 4, kind, prompt=prompt, n=2,
                          sampler=Sampler(0.8, 0.95, seed))
        t1, t2 = emitted(events)[:2]
        counts[t1 * target.vocab_size + t2] += 1
        for e in events:
            if e.draft_ids:
                check_tree(e, 4)
    keep = joint * n >= 5
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]])
    expected = torch.cat([joint[keep], joint[~keep].sum()[None]]) * n
    assert chi_square_p(observed, expected) > 1e-3


def test_tree_steps_round_trip_as_trace_steps(tiny_target, tiny_draft):
    from specviz.core.record import StepEvent

    events = run_tree(cached_model(tiny_target), ModelDrafter(cached_model(tiny_draft)), 4, n=6)
    assert any(e.tree.branching for e in events)
    assert all(StepEvent.from_dict(e.to_dict()) == e for e in events if e.tree.branching)
    # a single path's step is written as a chain's: it loads as one, its nodes as they were
    loaded = [StepEvent.from_dict(e.to_dict()) for e in events if not e.tree.branching]
    assert all(x.tree.kind == "single-path" and x.to_dict() == e.to_dict() and x.nodes == e.nodes
               for x, e in zip(loaded, [e for e in events if not e.tree.branching]))
    chain = list(decode(cached_model(tiny_target), PROMPTS[0], drafters=[NGramDrafter()], policy=FixedPolicy(2), max_new_tokens=4))
    assert all("tree" not in e.to_dict() for e in chain)  # a chain's steps are written as before


def test_an_older_traces_tree_nodes_load_as_node_records(tiny_target, tiny_draft):
    """Before version 5 a tree's nodes held token, parent, depth, p, q, u and accepted only: they load with their step's
    reasons and their acceptance probability recomputed, and written back they hold the keys they had and the record's."""
    from specviz.core.record import StepEvent

    events = run_tree(cached_model(tiny_target), ModelDrafter(cached_model(tiny_draft)), 6, n=12, sampler=Sampler(0.9, seed=2))
    step = next(e for e in events if e.tree.branching).to_dict()
    old_keys = ("token", "parent", "depth", "p", "q", "u", "accepted")
    step["tree"]["nodes"] = [{k: n[k] for k in old_keys} for n in step["tree"]["nodes"]]
    loaded = StepEvent.from_dict(step)
    assert [n.reason for n in loaded.nodes] == step["accept_reasons"] and "rejected" in step["accept_reasons"]
    assert all(n.p_top == n.q_top == [] for n in loaded.nodes)
    assert all(n.accept_prob == (None if n.accepted is None else pytest.approx(min(1.0, n.p / n.q))) for n in loaded.nodes)
    assert [n.accept_prob for n in loaded.nodes] == [n.accept_prob for n in next(e for e in events if e.tree.branching).nodes]
    again = loaded.to_dict()["tree"]["nodes"]
    assert [{k: n[k] for k in old_keys} for n in again] == step["tree"]["nodes"]


REAL_DRAFTS = ["head", "draft-m", "ngram"]


@pytest.mark.slow
@pytest.mark.parametrize("item", [0, 17, 40])
def test_real_target_trees_match_generate(bank, item):
    """The offline target, greedy, 32 tokens: trees of 4 and 8 nodes (dynamic; static at 8) from every drafter."""
    from specviz.analysis.suites import load_suite
    from specviz.runtime.config import DecodeConfig
    from specviz.runtime.prepare import prepare

    from .test_exact_real import generate_reference

    prompt = load_suite("all")[item]["prompt"]
    reference = generate_reference(prepare(DecodeConfig(method="ar", max_new_tokens=64), prompt, bank))[:32]
    for draft in REAL_DRAFTS:
        for nodes, kind in ((4, "dynamic"), (8, "dynamic"), (8, "static")):
            config = DecodeConfig(draft=draft, tree_nodes=nodes, tree_kind=kind, gamma_policy="fixed", max_new_tokens=32)
            run = prepare(config, prompt, bank)
            events = list(run.events())
            assert emitted(events) == reference, (draft, nodes, kind)
            for e in events:
                if e.draft_ids:
                    check_tree(e, nodes)


@pytest.mark.slow
def test_cli_json_contract_for_trees():
    import json
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "specviz", "generate", "--draft", "head", "--tree-nodes", "8", "--temperature", "0", "--json",
           "--max-new-tokens", "24", "--prompt", "List three primary colours."]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}).stdout)
    steps = [s for s in out["steps"] if s["draft_ids"]]
    assert steps and out["metrics"]["mean_accept_len"] == pytest.approx(len(out["token_ids"]) / len(out["steps"]))
    assert any("tree" in s for s in steps)
    for s in steps:
        if "tree" not in s:  # the draft came out a single path: recorded as a chain's step is
            assert s["verify"] and s["verify"][0]["token"] == s["draft_ids"][0]
            continue
        parents, path = s["tree"]["parents"], s["tree"]["accepted_path"]
        assert len(parents) == len(s["draft_ids"]) and all(-1 <= p < i for i, p in enumerate(parents))
        assert s["emitted_ids"][: len(path)] == [s["draft_ids"][i] for i in path]


@pytest.mark.parametrize("nodes", [4, 8])
@pytest.mark.parametrize("name", ["eagle", "eagle-qwen3-explicit-layers"])
def test_published_eagle3_head_trees_match_generate(target_models, heads, name, nodes):  # noqa: F811  (fixtures)
    lm = target_models[EAGLE3_HEADS[name][0]]
    for prompt in PROMPTS[:2]:
        drafter = drafter_for(lm, heads[name])
        events = run_tree(drafter.target, drafter, nodes, prompt=prompt, n=24)
        assert emitted(events) == reference(lm, prompt, 24)
        assert sum(len(e.draft_ids) for e in events) > 10
    drafter, tokens = drafter_for(lm, heads[name]), PROMPTS[3]
    drafter.read_states(0, drafter.target.forward(tokens, keep=1).layers)
    tree = drafter.draft(tokens, 8, 4, TreeShape(2, "static"), Sampler())
    assert [tree.ids[i] for i in range(0, 8, 2)] == drafter.draft(tokens, 4, 4, SINGLE_PATH, Sampler()).ids


@pytest.mark.parametrize("settings, message", [
    ({"accept": "judge"}, "exact rule only"),
    ({"chain": ["draft-s", "draft-m"]}, "one draft"),
    ({"gamma_policy": "fsm"}, "fixed or chosen by --gamma-policy online"),
    ({"method": "ar"}, "one draft"),
    ({"gamma": 5}, "--gamma has no effect with --tree-nodes: the node budget is --tree-nodes"),
    ({"gamma": 5, "gamma_policy": "online"}, "--gamma has no effect with --tree-nodes"),
])
def test_tree_settings_refuse_what_trees_do_not_support(settings, message):
    from specviz.core.errors import ConfigError
    from specviz.runtime.config import DecodeConfig

    with pytest.raises(ConfigError, match=message):
        DecodeConfig(tree_nodes=4, **settings).validate()


def test_a_tree_validates_with_gamma_at_its_default():
    """A form sends γ with every run: at its default it is no conflict, with either policy that budgets trees."""
    from specviz.runtime.config import DecodeConfig

    for policy in ("fixed", "online"):
        config = DecodeConfig.from_values({"tree_nodes": "6", "gamma": DecodeConfig.gamma, "gamma_policy": policy})
        assert (config.tree_nodes, config.gamma) == (6, DecodeConfig.gamma)


@pytest.mark.parametrize("sampler", [None, Sampler(0.9, seed=4)], ids=["greedy", "sampled"])
def test_views_draw_each_steps_tree_and_open_the_microscope_on_any_node(tiny_target, tiny_draft, sampler):
    from specviz.viz.teach import microscope_html, narrate

    events = run_tree(cached_model(tiny_target), ModelDrafter(cached_model(tiny_draft)), 6, n=12, sampler=sampler)
    branching = [x.to_dict() for x in events if x.tree.branching]  # the budget's best nodes may be one path: a chain's step
    assert branching and all(x.checked for x in events if x.draft_ids and not x.tree.branching)
    for e in branching:
        page, words = microscope_html(e, {}), narrate(e, {})
        path, nodes = e["tree"]["accepted_path"], e["tree"]["nodes"]
        assert page.count('class="sv-node sv-path"') == len(path)
        assert page.count('class="sv-node sv-rejected"') == sum(n["accepted"] is False for n in nodes)
        assert page.count('class="sv-node sv-unchecked"') == sum(n["accepted"] is None for n in nodes)
        cards = re.findall(r'<div class="sv-node-card sv-row-(\w+)" id="sv-node-(\d+)-(\d+)">(.*?)</div></div>', page)
        assert [(int(step), int(i)) for _, step, i, _ in cards] == [(e["step"], i) for i in range(len(nodes))]
        for (state, _, i, text), node in zip(cards, nodes):  # each node's card: its verdict and the test that gave it
            assert page.count(f'href="#sv-node-{e["step"]}-{i}"') == 2  # from the drawing and from the table
            assert state == ("path" if int(i) in path else "rejected" if node["accepted"] is False else "unchecked")
            if node["accepted"] is None:
                assert "Never checked" in text
            elif sampler is None:
                assert "Greedy" in text and ("it is, so" in text) == node["accepted"]
            else:
                assert f"u = {node['u']:.3f}" in text and ("u &lt; p/q" in text) == node["accepted"]
        assert "tree of" in words and ("won" in words or "No root child passed" in words)
        assert page.count('<input type="checkbox" class="sv-enc-toggle">') == 1  # q or p on the dots, by CSS alone
        drawn = len(nodes) + (len(e["emitted_ids"]) > len(path))  # and the target's own token after the path
        assert page.count('class="sv-dot sv-enc-q') == len(nodes) and page.count('class="sv-dot sv-enc-p') == drawn
        assert page.count("sv-dot-none") == sum(n["p"] is None for n in nodes)


@pytest.mark.parametrize("nodes", [8, 32, 64])
def test_a_tree_is_drawn_depth_left_to_right_with_siblings_stacked_inside_its_drawing(tiny_target, nodes):
    from specviz.viz.teach import BOX_H, BOX_W, LABEL_CHARS, tree_svg
    from specviz.viz.trace import layout

    events = run_tree(cached_model(tiny_target), ModelDrafter(cached_model(tiny_target)), nodes, n=12, sampler=Sampler(1.0, seed=1))
    for e in (x.to_dict() for x in events if x.draft_ids):
        parents = e["tree"]["parents"]
        places = layout(parents)
        assert all(places[i][0] == d for i, d in enumerate(depths(parents)))
        leaves = [i for i in range(len(parents)) if i not in parents]
        assert sorted(places[i][1] for i in leaves) == list(range(len(leaves)))  # leaves on consecutive rows
        for i in [-1, *range(len(parents))]:  # every other node level with the middle of its subtree's rows
            rows = [places[j][1] for j in leaves if j == i or i == -1 or i in ancestors(parents, j)]
            assert places[i][1] == (min(rows) + max(rows)) / 2
        pieces = {t: "a long token text" for t in e["draft_ids"] + e["emitted_ids"]}
        svg = tree_svg(e, pieces)
        width, height = map(float, re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg).groups())
        boxes = [tuple(map(float, b)) for b in re.findall(r'<rect x="([\d.]+)" y="([\d.]+)"', svg)]
        assert len(boxes) == len(parents) + 2 and all(x + BOX_W <= width and y + BOX_H <= height for x, y in boxes)
        labels = re.findall(r"<text [^>]*>([^<]*)</text>", svg)
        assert all(len(label.removeprefix("✓ ").removeprefix("✗ ").removeprefix("+ ")) <= LABEL_CHARS for label in labels)
        assert svg.count("a␣long␣token␣text") == len(parents) + 1  # the full text: in each node's tooltip


def test_the_token_view_reads_a_tree_step_as_its_accepted_path(tiny_target, tiny_draft):
    from specviz.viz.trace import step_spans

    events, context = run_tree(cached_model(tiny_target), ModelDrafter(cached_model(tiny_draft)), 6, n=12), list(PROMPTS[0])
    for e in events:
        spans = step_spans(e.to_dict(), context, Pieces())
        kept = [s for s in spans if s.kind not in ("rejected", "unchecked")]
        assert [s.token_id for s in kept] == e.emitted_ids
        context += e.emitted_ids


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
def test_a_stop_token_on_the_accepted_path_ends_the_steps_tree(tiny_target, temperature):
    from specviz.core.metrics import summarize
    from specviz.core.record import StepEvent
    from specviz.viz.teach import microscope_html, narrate
    from specviz.viz.trace import step_spans

    def steps(stop_ids=()):  # the target drafting for itself: its trees have long accepted paths
        return list(decode(cached_model(tiny_target), PROMPTS[0], drafters=[ModelDrafter(cached_model(tiny_target))],
                           policy=FixedPolicy(8), sampler=Sampler(temperature, seed=2), max_new_tokens=30, stop_ids=stop_ids,
                           tree=TreeShape(2, "dynamic")))

    full = steps()
    stop, at = a_stop_among_accepted_drafts(full)
    events = steps([stop])
    assert emitted(events) == emitted(full)[: at + 1] and emitted(events)[-1] == stop
    for e in events:
        if e.draft_ids:
            check_tree(e, 8)  # the accepted path is the emitted tokens' (or all but the target's own last one)
    last, tree = events[-1], events[-1].tree
    assert len(tree.accepted_path) == last.accepted == len(last.emitted_ids)
    below = [i for i, node in enumerate(last.nodes) if tree.accepted_path[-1] in ancestors(tree.parents, i)]
    assert below and all((last.nodes[i].p, last.nodes[i].u, last.nodes[i].accepted) == (None, None, None) for i in below)
    assert [last.accept_reasons[i] for i in below] == ["unchecked"] * len(below)
    metrics = summarize(events)
    assert metrics["accepted"] <= metrics["new_tokens"] - len(events) + 1
    assert all(StepEvent.from_dict(e.to_dict()) == e for e in events)
    words, page = narrate(last.to_dict(), {}), microscope_html(last.to_dict(), {})
    assert "is a stop token: the output ends there" in words and "then added" not in words
    assert page.count('class="sv-node sv-path"') == last.accepted and "sv-added" not in page
    assert page.count("the output ended at the stop token") == len(below)  # the cards of the nodes below it say why
    spans = step_spans(last.to_dict(), [], Pieces())
    assert [s.token_id for s in spans] == last.emitted_ids and {s.kind for s in spans} == {"accepted"}


def ancestors(parents: list[int], i: int) -> list[int]:
    up, out = parents[i], []
    while up >= 0:
        out.append(up)
        up = parents[up]
    return out


def test_the_online_policy_chooses_each_steps_budget(tiny_target):
    from specviz.methods.policies import OnlinePolicy

    events = list(decode(cached_model(tiny_target), PROMPTS[0], drafters=[ModelDrafter(cached_model(tiny_target))],
                         policy=OnlinePolicy.from_gamma(8), max_new_tokens=40, tree=TreeShape(2, "dynamic")))
    assert emitted(events) == reference(tiny_target, PROMPTS[0], 40)
    assert len({e.gamma for e in events}) > 1  # each step's node budget is the policy's choice of that step
    for e in events:
        room = 40 - sum(len(x.emitted_ids) for x in events[: e.step - 1]) - 1
        assert e.gamma == e.why["policy"]["gamma"] and e.drafted == len(e.draft_ids)
        assert e.drafted <= (min(e.gamma, MAX_TREE_NODES) if room > 0 else 0)
    assert any("pred_tok_s" in e.why["policy"] for e in events)


@pytest.mark.parametrize("tree", [SINGLE_PATH, TreeShape(2, "dynamic")])
def test_without_records_a_run_emits_the_same_and_leaves_out_what_only_views_read(tiny_target, tiny_draft, tree):
    def steps(record):
        return list(decode(cached_model(tiny_target), PROMPTS[0], drafters=[ModelDrafter(cached_model(tiny_draft))],
                           policy=FixedPolicy(6), sampler=Sampler(0.9, seed=3), max_new_tokens=20, tree=tree, record=record))

    full, lean = steps(True), steps(False)
    assert [e.emitted_ids for e in lean] == [e.emitted_ids for e in full]
    assert all(not (e.draft_p or e.draft_q or e.emitted_p or e.nodes) for e in lean)
    assert all(e.nodes for e in full if e.draft_ids)


def near_copy(lm, scale=0.05):
    """A draft close to ``lm``: its output weights off by a little noise, so that it keeps some drafts and not others."""
    near = copy.deepcopy(lm)
    with torch.no_grad():
        near.model.lm_head.weight.add_(scale * torch.randn(near.model.lm_head.weight.shape, generator=seeded(0)))
    return near


@pytest.mark.parametrize("shape", [SINGLE_PATH, TreeShape(2, "static"), TreeShape(2, "dynamic")], ids=lambda s: s.kind)
def test_a_greedy_step_that_records_nothing_computes_no_softmax_over_the_vocabulary(tiny_target, monkeypatch, shape):
    """Every shape, a dynamic tree's draw keys included: q and p are computed only where a step records them."""
    calls = []
    probs = Sampler.probs
    monkeypatch.setattr(Sampler, "probs", lambda self, logits: calls.append(logits.shape) or probs(self, logits))
    drafter = ModelDrafter(cached_model(near_copy(tiny_target)))

    def run(record):
        calls.clear()
        events = list(decode(cached_model(tiny_target), PROMPTS[1], drafters=[drafter], policy=FixedPolicy(4), max_new_tokens=24,
                             record=record, tree=shape))
        return emitted(events), [e.draft_ids for e in events], len(calls)
    lean, full = run(False), run(True)
    assert lean[2] == 0 and full[2] > 0
    assert lean[:2] == full[:2] and lean[0] == reference(tiny_target, PROMPTS[1], 24)  # the same trees either way


@pytest.mark.parametrize(("make", "shape"), [(make, SINGLE_PATH) for make in ("model", "model on transformers' cache", "head",
                                                                            "polybasic chain")]
                         + [(make, TreeShape(2, "static")) for make in ("model", "model on transformers' cache", "head")])
def test_unrecorded_greedy_drafts_stay_on_the_device_until_the_steps_one_read(tiny_target, tiny_draft, host_reads, make, shape):
    """A single path or a static tree (whose shape no draw key decides; a polybasic chain drafts single paths)."""
    target = cached_model(tiny_target, taps=(0, 1) if make == "head" else ())
    drafter = {"model": lambda: ModelDrafter(cached_model(near_copy(tiny_target))),
               "model on transformers' cache": lambda: ModelDrafter(CachedModel(near_copy(tiny_target))),
               "head": lambda: FeatureDrafter(random_head(tiny_target, 1, (0, 1)), target, None),
               "polybasic chain": lambda: build_chain(ModelDrafter(cached_model(tiny_draft)), [cached_model(tiny_draft)], 2),
               }[make]()
    reads, events = [], []
    for event in decode(target, PROMPTS[1], drafters=[drafter], policy=FixedPolicy(4), max_new_tokens=30, record=False,
                        tree=shape):
        reads.append(host_reads[0])  # made while computing this step (the first: the prefill's too)
        host_reads[0] = 0
        events.append(event)
    assert emitted(events) == reference(tiny_target, PROMPTS[1], 30)
    assert all(type(t) is int for e in events for t in e.draft_ids + e.emitted_ids)
    if make.startswith("model") and shape == SINGLE_PATH:  # drafts kept and rejected: the caches reuse what the read settled
        assert any(0 < e.accepted < e.drafted for e in events) and any(e.accepted == e.drafted for e in events)
    if make != "polybasic chain":  # whose levels verify, and read, inside the draft
        assert reads == [1] * len(events)


@pytest.mark.parametrize(("branch", "nodes", "depth"), [(2, 6, 4), (3, 10, 5), (3, 2, 4), (4, 12, 2), (2, 20, 8)])
def test_a_dynamic_tree_grown_on_the_device_is_the_tree_grown_with_reads(host_reads, monkeypatch, branch, nodes, depth):
    """Where reads wait, the frontier is chosen on the device: no read while growing, and after one read the same nodes,
    numbered alike, as the growth that reads each level (which stops early where no deeper node could enter)."""
    from specviz.core import tree as tree_module

    # after each token; the last row: the root. On the CPU whatever the test device, where no stop condition is posted
    logits = torch.randn(41, 40, generator=torch.Generator().manual_seed(branch * nodes + depth), device="cpu")
    calls = []

    def expand(feed):
        calls.append(feed.depth)
        return logits[-1:] if not feed.ids else logits[tree_module.ids_tensor(feed.ids, torch.device("cpu"))]

    def grown():
        calls.clear()
        return grow_tree(expand, TreeShape(branch, "dynamic"), nodes, depth, Sampler(), keep_q=False, finite=True).tree

    read, read_calls = grown(), len(calls)
    host_reads[0] = 0
    monkeypatch.setattr(tree_module, "reads_wait", lambda device: True)
    unread = grown()
    assert host_reads[0] == 0 and len(calls) == depth  # no stop condition is posted from a CPU: it grows to its depth
    assert all(isinstance(t, tree_module.DeviceToken) for t in unread.ids + unread.parents)
    assert [int(t) for t in unread.ids] == [int(t) for t in read.ids] and [int(p) for p in unread.parents] == read.parents
    assert len(read.ids) == min(nodes, branch + branch * branch * (depth - 1))

    class Landed:  # a CUDA event whose copy has landed
        def query(self):
            return True

        def synchronize(self):
            pass

    monkeypatch.setattr(tree_module, "_posted", lambda condition: None if condition is None else (condition.clone(), Landed()))
    stopped = grown()  # as on CUDA when each level's condition lands at once: it stops where the reading growth stops
    assert [int(t) for t in stopped.ids] == read.ids and [int(p) for p in stopped.parents] == read.parents
    assert len(calls) == read_calls
    Landed.query = lambda self: False  # a copy that lands only when waited for, a level later: one level more at most
    late = grown()
    assert [int(t) for t in late.ids] == read.ids and [int(p) for p in late.parents] == read.parents
    assert read_calls <= len(calls) <= min(read_calls + 1, depth)


@pytest.mark.parametrize("make", ["model", "model on transformers' cache", "head"])
def test_where_reads_wait_a_dynamic_tree_stays_on_the_device_until_the_steps_one_read(tiny_target, host_reads, monkeypatch, make):
    from specviz.core import tree as tree_module

    def run():
        target = cached_model(tiny_target, taps=(0, 1) if make == "head" else ())
        drafter = {"model": lambda: ModelDrafter(cached_model(near_copy(tiny_target))),
                   "model on transformers' cache": lambda: ModelDrafter(CachedModel(near_copy(tiny_target))),
                   "head": lambda: FeatureDrafter(random_head(tiny_target, 1, (0, 1)), target, None)}[make]()
        reads, events = [], []
        for event in decode(target, PROMPTS[1], drafters=[drafter], policy=FixedPolicy(10), max_new_tokens=30, record=False,
                            tree=TreeShape(3, "dynamic")):
            reads.append(host_reads[0])
            host_reads[0] = 0
            events.append(event)
        return reads, events

    _, read = run()
    monkeypatch.setattr(tree_module, "reads_wait", lambda device: True)
    reads, unread = run()
    assert emitted(unread) == emitted(read) == reference(tiny_target, PROMPTS[1], 30)
    assert [(e.draft_ids, e.tree.parents) for e in unread] == [(e.draft_ids, e.tree.parents) for e in read]
    assert all(type(t) is int for e in unread for t in e.draft_ids + e.tree.parents)
    assert any(max(depths(e.tree.parents), default=0) >= 2 for e in unread)
    assert reads == [1] * len(unread)


@pytest.mark.parametrize("record", [False, True], ids=["unrecorded", "recorded"])
def test_a_dynamic_tree_reads_the_device_once_per_level_whatever_its_branching(tiny_target, host_reads, monkeypatch, record):
    """On a CPU, where a read costs nothing, its draw keys are read to choose the next frontier, once per level for all
    its nodes; the verify reads once more."""
    from specviz.core import tree as tree_module

    levels, children = [0], tree_module.children
    monkeypatch.setattr(tree_module, "children", lambda *a: levels.__setitem__(0, levels[0] + 1) or children(*a))
    monkeypatch.setattr(tree_module, "reads_wait", lambda device: False)  # as on a CPU, whatever the test device
    drafter = ModelDrafter(cached_model(near_copy(tiny_target)))
    reads, per_step, events = [], [], []
    for event in decode(cached_model(tiny_target), PROMPTS[1], drafters=[drafter], policy=FixedPolicy(10), max_new_tokens=30,
                        record=record, tree=TreeShape(3, "dynamic")):
        reads.append(host_reads[0])
        per_step.append(levels[0])
        host_reads[0] = levels[0] = 0
        events.append(event)
    assert emitted(events) == reference(tiny_target, PROMPTS[1], 30)
    assert any(max(depths(e.tree.parents)) >= 2 and len(e.draft_ids) > 3 for e in events)  # branched and deep
    if not record:  # a recorded step reads its p and q for the view besides
        assert reads[1:] == [n + 1 for n in per_step[1:]]
    assert all(n <= max(depths(e.tree.parents)) + 1 for n, e in zip(per_step, events))  # a call per level grown, not per node
