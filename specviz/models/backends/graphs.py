"""CUDA graphs of the lean forward: one graph per input shape, captured on first use, replayed after.

A small model's step on a GPU is bound by kernel launches, not arithmetic: a graph launches a whole forward's
kernels at once. A graph replays the kernels it recorded on the memory it recorded, so inputs are copied into
buffers kept for it and outputs come from buffers it owns (copied out: the next replay overwrites them). Only a
forward whose shapes depend on its key alone can be recorded: the lean stack's fixed-capacity mode
(:class:`~specviz.models.backends.lean.LeanStack`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from specviz.core.errors import first_line

MAX_GRAPHED_LENGTH = 64
"""Feeds longer than this run without a graph, as does a prefill (a feed from the first slot): they come once per run,
so a recording would not pay."""

Outputs = tuple[torch.Tensor, ...]
Capture = Callable[[Callable[[], Outputs]], tuple[Callable[[], None], Outputs]]
"""Records ``fn`` and returns (replay, the outputs every replay writes)."""


def cuda_capture(fn: Callable[[], Outputs]) -> tuple[Callable[[], None], Outputs]:
    """A CUDA graph of ``fn``, after one warm-up run on a side stream (as ``torch.cuda.graph`` requires: it makes the
    lazily built cuBLAS and attention state; a second would only add a forward to every recording made inside a call)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def eager_capture(fn: Callable[[], Outputs]) -> tuple[Callable[[], None], Outputs]:
    """The contract of :func:`cuda_capture` without a graph, on any device: a replay reruns ``fn`` and writes into
    the first run's outputs. The tests check the buffer bookkeeping of :class:`Graphs` with it on a CPU."""
    out = fn()

    def replay() -> None:
        for buffer, new in zip(out, fn()):
            buffer.copy_(new)
    return replay, out


class Graphs:
    """``fn(key, *inputs)`` through one recorded graph per ``key``; ``key`` must fix every shape ``fn`` sees.

    A recording that fails (a process whose driver or allocator refuses graphs, as a sandboxed GPU worker may) is not
    retried: ``failure`` says why, and from then on every call runs ``fn`` eagerly, with the same results."""

    def __init__(self, fn: Callable[..., Outputs], capture: Capture = cuda_capture):
        self.fn, self.capture = fn, capture
        self.recorded: dict[Hashable, tuple[Outputs, Callable[[], None], Outputs]] = {}
        self.failure: str | None = None

    def __call__(self, key: Hashable, *inputs: torch.Tensor) -> Outputs:
        if self.failure is not None:
            return self.fn(key, *inputs)
        if key not in self.recorded:
            buffers = tuple(x.clone() for x in inputs)
            try:
                replay, out = self.capture(lambda: self.fn(key, *buffers))
            except RuntimeError as exc:  # CUDA reports a refused capture as a RuntimeError; anything else is a bug
                self.failure = f"{type(exc).__name__}: {first_line(exc)[:160]}"
                return self.fn(key, *inputs)
            self.recorded[key] = buffers, replay, out
        buffers, replay, out = self.recorded[key]
        for buffer, x in zip(buffers, inputs):
            buffer.copy_(x)
        replay()
        return tuple(o.clone() for o in out)
