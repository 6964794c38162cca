"""Judge decoding's judge head: a linear layer + sigmoid on the target's pre-norm last hidden state.

A draft token is *acceptable* when the head's score at the position whose input is that token exceeds δ;
:class:`JudgeRule` accepts a token that the exact rule or the judge accepts. The head is fitted by
:mod:`specviz.training.judge_fit` and folded so that :meth:`JudgeHead.score` reads raw pre-norm states
straight from the verify pass.

With ``confidence`` the head also reads two numbers the verify pass has anyway: the target's log-probability of
the token and its top log-probability at that position (an extension of the paper's head, 2 more parameters: a
135M target's states alone barely separate a wrong digit from a right one, its own confidence does).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specviz.core.acceptance import Checked, ExactRule, Relaxed
from specviz.core.errors import ModelLoadError, first_line
from specviz.core.registry import ACCEPT_RULES
from specviz.models.paths import ASSETS

HEAD_FORMAT = "specviz-judge-head/1"


class JudgeLoadError(ModelLoadError):
    """A judge head file is missing, unreadable or was trained for another target; one-line message."""


def default_head_path(target_name: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", target_name.lower()).strip("-")
    return ASSETS / "judges" / f"{slug}.json"










@dataclass
class JudgeHead:
    """``sigmoid(x @ weight + bias)`` over raw pre-norm states x (hidden_size + 1 parameters), with ``confidence``
    followed by the two :func:`confidence_features` (2 more)."""

    weight: torch.Tensor
    bias: float
    target: str
    hidden_size: int
    meta: dict = field(default_factory=dict)
    confidence: bool = False
    _on_device: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def n_parameters(self) -> int:
        return self.weight.numel() + 1

    @property
    def n_inputs(self) -> int:
        return self.hidden_size + 2 * self.confidence

    def inputs(self, states: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """What the head reads for n tokens: their pre-norm states (n, hidden) and, with ``confidence``, the
        logits rows (n, vocab) that predicted the tokens ``ids`` (n,)."""
        if not self.confidence:
            return states
        return torch.cat([states.float(), confidence_features(logits, ids).to(states.device)], -1)

    def columns(self, X: torch.Tensor) -> torch.Tensor:
        """The columns of a features matrix (see :func:`build_features`) this head reads."""
        return X[:, : self.n_inputs]

    def score(self, states: torch.Tensor) -> torch.Tensor:
        """(n, n_inputs) inputs of any dtype/device -> (n,) float32 scores in [0, 1] on the same device."""
        w = self._on_device.get(states.device)
        if w is None:
            w = self._on_device[states.device] = self.weight.to(states.device, torch.float32)
        return torch.sigmoid(states.float() @ w + self.bias)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": HEAD_FORMAT, "target": self.target, "hidden_size": self.hidden_size, "confidence": self.confidence,
                "bias": self.bias, "meta": self.meta, "weight": self.weight.tolist()}
        path.write_text(json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path, target_name: str, hidden_size: int) -> JudgeHead:
        """Read a head saved by :meth:`save`; raises :class:`JudgeLoadError` unless it fits the target."""
        path = Path(path)
        if not path.is_file():
            raise JudgeLoadError(f"no judge head for '{target_name}' at {path}: train one with `python -m specviz judge train`")
        try:
            data = json.loads(path.read_text())
            if data["format"] != HEAD_FORMAT:
                raise ValueError(f"format {data['format']!r}")
            head = cls(torch.tensor(data["weight"], dtype=torch.float32), float(data["bias"]), str(data["target"]),
                       int(data["hidden_size"]), dict(data["meta"]), bool(data.get("confidence", False)))
            if head.weight.shape != (head.n_inputs,) or not torch.isfinite(head.weight).all():
                raise ValueError("weight does not match hidden_size")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            reason = first_line(exc)[:120]
            raise JudgeLoadError(f"judge head {path} is unreadable: {reason}") from None
        if head.target != target_name:
            raise JudgeLoadError(f"judge head {path} was trained for target '{head.target}', not '{target_name}'")
        if head.hidden_size != hidden_size:
            raise JudgeLoadError(f"judge head {path} expects hidden size {head.hidden_size}, the target has {hidden_size}")
        return head






























@ACCEPT_RULES.register("Judge decoding: also accept a token the judge head scores above δ.", ("judge_threshold",))
class JudgeRule(ExactRule):
    """Judge decoding: accept a draft token whose judge score (a linear head on the target's pre-norm
    state at the position whose input is that token, and optionally the target's confidence in it) exceeds δ;
    δ = 1 is the exact rule."""

    name = "judge"
    needs_states = True

    def __init__(self, head, threshold: float):
        self.head, self.threshold = head, threshold

    @classmethod
    def from_settings(cls, settings, target) -> JudgeRule:
        """The judge head trained for this target, at the run's δ."""
        head = JudgeHead.load(default_head_path(target.name), target.name, target.model.config.hidden_size)
        return cls(head, settings.judge_threshold)

    def relaxed(self, c: Checked) -> Relaxed:
        # states[0] is the last committed token's; states[i + 1] has draft token i as its input
        states = c.states[1: len(c.ids) + 1]
        scores = self.head.score(self.head.inputs(states, c.logits.to(states.device), c.ids)).to(c.ids.device)
        return Relaxed(scores > self.threshold, scores, self.threshold)


def confidence_features(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(n, 2): the target's log p of each token and the top log p, from the logits row that predicted it."""
    logp = logits.float().log_softmax(-1)
    return torch.stack([logp.gather(-1, ids.view(-1, 1).to(logp.device))[:, 0], logp.max(-1).values], -1)
