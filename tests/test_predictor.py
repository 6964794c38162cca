"""The prompt-feature acceptance predictor: features by hand, least squares, clipping, persistence and priors."""

import json
import math
import random

import pytest
import torch

from specviz.core.drafters import Drafter, ModelDrafter, NGramDrafter
from specviz.methods.predictor import FEATURES, AcceptancePredictor, draft_log_perplexity, prompt_features, repeat_fraction
from specviz.methods.state_drafter import ForwardTimer
from specviz.models.backends import cached_model
from specviz.training.predictor_fit import fit_weights


@pytest.mark.parametrize("ids, expected", [
    ([], 0.0),
    ([4], 0.0),
    ([1, 2, 3, 4], 0.0),
    ([7, 7, 7], 1.0),  # (7, 7) twice: both bigrams repeat
    ([1, 2, 1, 2, 3], 0.5),  # (1, 2) x2 of 4 bigrams
    ([1, 2, 1, 2, 1, 2], 1.0),  # (1, 2) x3 and (2, 1) x2
    ([5, 6, 9, 5, 6, 9, 0, 1], 4 / 7),  # (5, 6) x2 and (6, 9) x2 of 7
    ([1, 2, 2, 1], 0.0),  # (1, 2), (2, 2), (2, 1): order matters
])
def test_repeat_fraction_by_hand(ids, expected):
    assert repeat_fraction(ids) == pytest.approx(expected)


def test_fit_weights_recovers_noiseless_linear_weights():
    rng = random.Random(0)
    true = [0.4, 0.05, -0.08, 0.3]
    features = [[1.0, math.log(rng.randint(5, 300)), rng.uniform(0.5, 6), rng.random()] for _ in range(200)]
    acceptance = [sum(w * f for w, f in zip(true, row)) for row in features]
    assert fit_weights(features, acceptance) == pytest.approx(true, abs=1e-3)


def test_fit_weights_survives_a_constant_zero_feature():
    """The n-gram drafter's perplexity feature is always 0: the ridge keeps the system solvable and its weight 0."""
    rng = random.Random(1)
    features = [[1.0, rng.uniform(1, 6), 0.0, rng.random()] for _ in range(50)]
    acceptance = [0.2 + 0.1 * f[1] - 0.5 * f[3] for f in features]
    w = fit_weights(features, acceptance)
    assert all(math.isfinite(v) for v in w)
    assert w == pytest.approx([0.2, 0.1, 0.0, -0.5], abs=2e-3)


def test_prompt_features_without_a_model():
    ids = [3, 4, 3, 4, 9]
    assert prompt_features(ids, NGramDrafter()) == pytest.approx([1.0, math.log(5), 0.0, 0.5])


def test_prompt_features_of_a_feature_head_leave_perplexity_out():
    head = Drafter()
    head.models = [ForwardTimer("head", torch.device("cpu"))]  # what a FeatureDrafter counts its forwards with: not a CachedModel
    assert prompt_features([3, 4, 3, 4, 9], head) == pytest.approx([1.0, math.log(5), 0.0, 0.5])


def test_prompt_features_with_a_model_use_its_mean_nll(tiny_draft):
    ids = [5, 17, 3, 9, 22, 5, 17]
    drafter = ModelDrafter(cached_model(tiny_draft))
    with torch.no_grad():
        logp = tiny_draft.model(torch.tensor([ids])).logits[0].log_softmax(-1)
    nll = -sum(logp[t, ids[t + 1]].item() for t in range(len(ids) - 1)) / (len(ids) - 1)
    assert draft_log_perplexity(drafter.models[0], ids) == pytest.approx(nll, rel=1e-4)
    assert prompt_features(ids, drafter) == pytest.approx([1.0, math.log(7), nll, 2 / 6], rel=1e-4)
    assert prompt_features([5], drafter)[2] == 0.0  # one token: nothing to predict


@pytest.mark.parametrize("bias, expected", [(0.37, 0.37), (5.0, 0.99), (-2.0, 0.01), (0.99, 0.99), (0.005, 0.01)])
def test_predict_is_linear_and_clipped(bias, expected):
    ids = [3, 4, 3, 4, 9]
    predictor = AcceptancePredictor({"ngram": [bias, 0.0, 0.0, 0.0]})
    assert predictor.predict(NGramDrafter(), ids) == pytest.approx(expected)
    slope = AcceptancePredictor({"ngram": [0.1, 0.05, 1.0, 0.2]})
    assert slope.predict(NGramDrafter(), ids) == pytest.approx(0.1 + 0.05 * math.log(5) + 0.2 * 0.5)


def test_priors_skip_drafters_without_weights(tiny_draft):
    model_drafter = ModelDrafter(cached_model(tiny_draft))
    predictor = AcceptancePredictor({"ngram": [0.3, 0.0, 0.0, 0.0]})
    assert predictor.predict(model_drafter, [1, 2, 3]) is None
    assert predictor.priors([NGramDrafter(), model_drafter], [1, 2, 3]) == {"ngram": pytest.approx(0.3)}
    assert AcceptancePredictor({}).priors([NGramDrafter(), model_drafter], [1, 2, 3]) == {}
    both = AcceptancePredictor({"ngram": [0.3, 0, 0, 0], model_drafter.name: [2.0, 0, 0, 0]})
    assert both.priors([NGramDrafter(), model_drafter], [1, 2, 3]) == {"ngram": pytest.approx(0.3), model_drafter.name: 0.99}


def test_save_load_round_trip(tmp_path):
    path = tmp_path / "predictor.json"
    weights = {"draft-s": [0.1, 0.2, -0.3, 0.4], "ngram": [0.5, 0.0, 0.0, 0.25]}
    meta = {"prompts": 25, "fit": {"ngram": {"mean_abs_error": 0.05}}}
    AcceptancePredictor(weights, meta).save(path)
    assert json.loads(path.read_text())["features"] == list(FEATURES)
    loaded = AcceptancePredictor.load(path)
    assert loaded.weights == weights and loaded.meta == meta
    assert loaded.predict(NGramDrafter(), [1, 2, 1, 2]) == pytest.approx(0.5 + 0.25 * 2 / 3)


def test_load_of_a_missing_file_is_none(tmp_path):
    assert AcceptancePredictor.load(tmp_path / "absent.json") is None
    assert AcceptancePredictor({"ngram": [0.5, 0, 0, 0]}).meta == {}
