"""Acceptance rules: decide how much of a draft the target keeps and which token it adds.

Every rule returns a :class:`Verdict`. The exact rule is lossless: greedy keeps drafts equal to the
target's argmax; sampling is Leviathan et al.'s rule with the residual ``norm(max(0, p − q))`` and a
bonus token drawn from ``p_{γ+1}`` when everything was accepted. The relaxed rules (judge, lenient,
top-k) keep a token when the exact rule accepts it **or** their own criterion does, then finish the
step exactly as the exact rule would — so with the criterion switched off they reproduce it token for
token, random draws included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specviz.core.drafters import Draft
from specviz.core.registry import ACCEPT_RULES
from specviz.core.sampling import Sampler, residual

ACCEPTED, REJECTED, UNCHECKED = "exact", "rejected", "unchecked"
TOP_K = 10
"""Alternatives recorded per verified position: the k most likely tokens of p, of q and of the residual."""


@dataclass
class Verdict:
    """``accepted`` drafts kept, then ``next_token`` from the target; one reason per drafted token."""

    accepted: int
    next_token: int
    reasons: list[str]
    judge_scores: list[float] | None = None
    records: list[dict] = field(default_factory=list)


def reasons_for(accepted: int, drafted: int, kept_as: list[str] | None = None) -> list[str]:
    kept = kept_as or [ACCEPTED] * accepted
    tail = [REJECTED] + [UNCHECKED] * (drafted - accepted - 1) if accepted < drafted else []
    return kept + tail


def one_hot_rows(ids: list[int], vocab: int, device: torch.device) -> torch.Tensor:
    q = torch.zeros(len(ids), vocab, device=device)
    q[torch.arange(len(ids)), torch.tensor(ids, device=device)] = 1.0
    return q


@dataclass
class Checked:
    """What a rule sees for the γ drafted positions: ids, target logits and p, the draft's q and the
    uniform draws of the exact test (both None when greedy), the target's pre-norm states (γ + 1 rows)."""

    ids: torch.Tensor
    logits: torch.Tensor
    p: torch.Tensor
    q: torch.Tensor | None
    u: torch.Tensor | None
    states: torch.Tensor | None

    def px_qx(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.arange(len(self.ids), device=self.ids.device)
        return self.p[rows, self.ids], self.q[rows, self.ids]


@ACCEPT_RULES.register("Lossless: accept with probability min(1, p/q); greedy: accept the target's argmax.")
class ExactRule:
    """Standard (lossless) speculative verification; subclasses add a criterion in :meth:`relaxed`."""

    name = "exact"
    needs_states = False

    @classmethod
    def from_settings(cls, settings, target) -> ExactRule:
        """The registry's protocol: a rule from the run's settings (a DecodeConfig) and the target (a LoadedModel); by
        default the rule's registered settings, in order, are its constructor's arguments."""
        return cls(*(getattr(settings, name) for name in ACCEPT_RULES.entry(cls.name).params))

    def verify(self, draft: Draft, logits: torch.Tensor, p: torch.Tensor, sampler: Sampler,
               states: torch.Tensor | None = None, record: bool = True) -> Verdict:
        """The verdict on ``draft``; with ``record``, one record per verified position for the views (:meth:`records`)."""
        if not draft.ids:
            return Verdict(0, int(sampler.pick(logits[0], p[0])), [])
        gamma = len(draft.ids)
        ids = torch.tensor(draft.ids, dtype=torch.long, device=logits.device)
        if sampler.greedy:
            best = logits.argmax(-1)
            c = Checked(ids, logits[:gamma], p[:gamma], None, None, states)
            exact = ids == best[:gamma]
        else:
            q = draft.q.to(p.device) if draft.q is not None else one_hot_rows(draft.ids, p.shape[-1], p.device)
            c = Checked(ids, logits[:gamma], p[:gamma], q, sampler.uniform(gamma, p.device), states)
            px, qx = c.px_qx()
            exact = c.u * qx < px
        extra, scores = self.relaxed(c)
        n = first_false(exact | extra)
        kept = [ACCEPTED if hit else self.name for hit in exact[:n].tolist()]  # one host read, not one per token
        corrected = None if sampler.greedy or n == gamma else residual(p[n], c.q[n])
        if sampler.greedy:
            nxt = int(best[n])
        else:
            nxt = int(sampler.draw(p[gamma] if corrected is None else corrected))
        records = self.records(c, draft, exact, n, kept, scores, nxt, corrected) if record else []
        return Verdict(n, nxt, reasons_for(n, gamma, kept), scores, records)

    def records(self, c: Checked, draft: Draft, exact: torch.Tensor, n: int, kept: list[str], scores: list[float] | None,
                emitted: int, corrected: torch.Tensor | None) -> list[dict]:
        """One record per verified position (the accepted ones and the first rejection; later drafts are never
        checked): the token, p and q of it, the acceptance probability of the exact test, the uniform draw u that
        decided it (None when greedy), the verdict and its reason, the top tokens of p and q, and at a rejection the
        residual the correction was drawn from (sampling) or the target's argmax (greedy); judge runs add the score
        and δ. Reading these changes nothing the rule decides."""
        m = min(n + 1, len(draft.ids))
        rows = torch.arange(m, device=c.ids.device)
        q = c.q if c.q is not None else (draft.q.to(c.p.device) if draft.q is not None
                                          else one_hot_rows(draft.ids, c.p.shape[-1], c.p.device))
        px, qx = c.p[rows, c.ids[:m]].tolist(), q[rows, c.ids[:m]].tolist()
        k = min(TOP_K, c.p.shape[-1])
        p_top, q_top = _pairs(c.p[:m].topk(k)), _pairs(q[:m].topk(k))  # one transfer each, not one per row
        u = [None] * m if c.u is None else c.u[:m].tolist()
        out, hits, ids = [], exact[:m].tolist(), c.ids[:m].tolist()
        for i in range(m):
            out.append({"token": ids[i], "p": px[i], "q": qx[i],
                        "accept_prob": float(hits[i]) if c.u is None else min(1.0, px[i] / qx[i]) if qx[i] > 0 else 1.0,
                        "u": u[i], "accepted": i < n, "reason": kept[i] if i < n else REJECTED,
                        "p_top": p_top[i], "q_top": [pair for pair in q_top[i] if pair[1] > 0]})
            if scores is not None:
                out[i].update(score=scores[i], threshold=self.threshold)
        if n < len(draft.ids):
            if corrected is None:
                out[n]["argmax"] = emitted
            else:
                top = _pairs(corrected[None].topk(k))[0]
                out[n]["residual_top"] = {"top": [pair for pair in top if pair[1] > 0], "emitted": emitted}
        return out

    def relaxed(self, c: Checked) -> tuple[torch.Tensor, list[float] | None]:
        """Acceptances beyond the exact rule (none here), and the judge scores if the rule has any."""
        return torch.zeros_like(c.ids, dtype=torch.bool), None


@ACCEPT_RULES.register("Leviathan's lenience l: accept with probability min(1, p/(l·q)); l = 1 is exact.", ("lenience",))
class LenientRule(ExactRule):
    """Leviathan's lenience l ∈ (0, 1]: sampling accepts with min(1, p/(l·q)) (same draw as the exact
    test); greedy accepts a draft whose target probability is ≥ l × the top one. l = 1 is exact."""

    name = "lenient"

    def __init__(self, lenience: float):
        self.lenience = lenience

    def relaxed(self, c: Checked) -> tuple[torch.Tensor, None]:
        if c.u is None:
            rows = torch.arange(len(c.ids), device=c.ids.device)
            return c.p[rows, c.ids] >= self.lenience * c.p.max(-1).values, None
        px, qx = c.px_qx()
        return c.u * qx * self.lenience < px, None


@ACCEPT_RULES.register("Accept a draft token that is among the target's k most likely.", ("topk",))
class TopKRule(ExactRule):
    """Accept a draft token that is among the target's k most likely tokens."""

    name = "topk"

    def __init__(self, k: int):
        self.k = k

    def relaxed(self, c: Checked) -> tuple[torch.Tensor, None]:
        top = c.logits.topk(min(self.k, c.logits.shape[-1]), dim=-1).indices
        return (top == c.ids[:, None]).any(-1), None




def _pairs(top) -> list[list[list]]:
    """[token, value] pairs per row of a batched ``topk``, read from the device in one transfer."""
    both = torch.stack([top.indices.double(), top.values.double()]).tolist()  # float64 holds every token id exactly
    return [[[int(t), x] for t, x in zip(ids, values)] for ids, values in zip(*both)]


def first_false(mask: torch.Tensor) -> int:
    """Length of the leading run of True."""
    misses = (~mask).nonzero()
    return int(misses[0]) if len(misses) else len(mask)
