"""The base of the drafters that draft from the target's own hidden states (the feature head, published EAGLE-3 heads).

:class:`StateDrafter` keeps the states the decoding loop hands it for the committed tokens and feeds them to its head
before each proposal; :func:`state_expander` grows token trees from the head's outputs. A subclass loads its head through the model bank
and runs its forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specviz.core.cache import CachedModel, TreeRows, grown
from specviz.core.drafters import Drafter
from specviz.core.timing import ForwardTimes, Timed
from specviz.core.tree import Expander, Feed, ids_tensor, single_path, tree_rows


class ForwardTimer(Timed):
    """Forward count and seconds of a drafter that is not a CachedModel (the engine sums ``forward_s``)."""

    def __init__(self, name: str, device: torch.device):
        self.name, self.times = name, ForwardTimes(device)


class StateDrafter(Drafter):
    """A drafter that drafts from the target's states (the feature head, published EAGLE-3 heads): a proposal first
    feeds the head every committed position it has not read with the target's states there (the target, built with
    the head's taps, returns them and the loop hands them over: :meth:`read_states`), then drafts from the head's own
    outputs. The head's KV cache therefore
    holds the target's states at committed positions: whatever drafts of a rejected branch wrote there is overwritten
    at the next proposal, so rejected drafts need no bookkeeping. A subclass gives :meth:`load` and :meth:`from_head`
    (how its head is loaded and built into a drafter), :meth:`_state`, :meth:`_forward` and :meth:`_logits`."""

    reads_features = True
    finite = True

    def __init__(self, name: str, target: CachedModel):
        self.name, self.target, self.timer = name, target, ForwardTimer(name, target.lm.device)
        self.models = [self.timer]
        self.fed: list[int] = []  # fed[i]: the token x[i+1] the head read at position i together with the target's state s[i]
        self.states: dict[int, torch.Tensor] = {}  # tapped layer → the target's output at each committed slot handed over
        self.known = 0  # the slots handed over

    @classmethod
    def load(cls, source: str, bank, target) -> object:
        """The head ``source`` from ``bank`` (a ModelBank, which loads it once per process) for the loaded ``target``."""
        raise NotImplementedError

    @classmethod
    def from_head(cls, name: str, loaded: object, context) -> StateDrafter:
        """The drafter over what :meth:`load` returned, for the run of ``context`` (a DraftContext)."""
        raise NotImplementedError

    @classmethod
    def preload(cls, source: object, bank, target) -> None:
        """Load the head into ``bank`` (a ModelBank) for the loaded ``target``, computing nothing."""
        cls.load(str(source), bank, target)

    @classmethod
    def from_source(cls, name: str, source: object, context) -> StateDrafter:
        return cls.from_head(name, cls.load(str(source), context.bank, context.target_lm), context)

    def _state(self, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        """The head's input state s (fed, hidden) from the target's tapped layer outputs."""
        raise NotImplementedError

    def _forward(self, states: torch.Tensor, next_ids: list[int], start: int, rows: TreeRows | None) -> torch.Tensor:
        """The head's outputs (t, hidden) after each of ``next_ids``, read with ``states`` at slots ``start``.. (in a
        token tree where ``rows`` says so)."""
        raise NotImplementedError

    def _logits(self, state: torch.Tensor) -> torch.Tensor:
        """The draft's logits (rows, target vocab) from the head's outputs, −inf outside its draft vocabulary."""
        raise NotImplementedError

    def _run(self, states: torch.Tensor, next_ids: list[int], start: int, rows: TreeRows | None = None) -> torch.Tensor:
        t0 = self.timer.times.start()
        out = self._forward(states, next_ids, start, rows)
        self.timer.times.stop(t0)  # timed like every other model's forward
        return out

    def read_states(self, first: int, states: dict[int, torch.Tensor]) -> None:
        for i in self.target.taps:
            rows = states[i]
            self.states[i] = grown(self.states.get(i), first + len(rows), rows)
            self.states[i][first: first + len(rows)] = rows
        self.known = first + len(states[self.target.taps[0]])

    def _catch_up(self, tokens: list[int], upto: int) -> torch.Tensor | None:
        """Feed positions up to ``upto`` (exclusive) with the target's states; the last output, if any was fed."""
        if upto <= 0:
            return None
        assert upto <= self.known, "the target's states of every committed slot are handed over before a draft"
        valid = next((i for i, (a, b) in enumerate(zip(self.fed, tokens[1:upto + 1])) if a != b), min(len(self.fed), upto))
        valid = min(valid, upto - 1)  # re-feed at least one position: its output starts the draft
        self.fed = tokens[1:upto + 1]
        states = {i: kept[valid:upto] for i, kept in self.states.items()}
        return self._run(self._state(states), tokens[valid + 1:upto + 1], valid)[-1:]

    @torch.inference_mode()
    def expander(self, tokens: list[int]) -> Expander:
        n = len(tokens) - 1
        return state_expander(self._catch_up(tokens, n), n, self._run, self._logits, self.target.vocab_size)

    @torch.inference_mode()
    def prefill(self, tokens: list[int]) -> None:
        self._catch_up(tokens, len(tokens) - 2)

    def can_draft(self, tokens: list[int]) -> bool:
        return len(tokens) >= 2


def state_expander(root: torch.Tensor | None, committed: int, run: Callable[[torch.Tensor, list[int], int, TreeRows], torch.Tensor],
                   logits: Callable[[torch.Tensor], torch.Tensor], vocab: int) -> Expander:
    """The expander of a drafter that drafts from states (a feature head, EAGLE-3): a node reads its parent's output
    (a root child: ``root``, the output at the last of the ``committed`` positions) and its own token, fed by ``run(states,
    ids, start slot, rows)`` after the committed positions at position committed − 1 + its depth, attending to them and to
    its ancestors; ``logits`` turns outputs into the draft's logits. No root (a one-token prompt): no node."""
    outs: list[torch.Tensor] = [root]  # the output after the root, then after each row fed
    fed_parents: list[int] = []  # the rows fed so far, as a tree

    @torch.inference_mode()
    def expand(feed: Feed) -> torch.Tensor:
        if not feed.ids:
            return logits(root) if root is not None else torch.full((1, vocab), -torch.inf)
        k = len(feed.ids)
        states = torch.cat(outs)[ids_tensor(feed.rows, root.device) + 1]
        fed_parents.extend(feed.rows)
        rows = None  # a single path: its slots are its positions, attending causally
        if not single_path(fed_parents):
            visible, _ = tree_rows(fed_parents, committed, len(fed_parents) - k)
            rows = TreeRows(torch.full((k,), committed - 1 + feed.depth), visible)
        out = run(states, feed.ids, committed + len(fed_parents) - k, rows)
        outs.append(out)
        return logits(out)
    return expand
