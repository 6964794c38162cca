"""The app's decodes, run where the device is: on a ZeroGPU Space each call below runs in the GPU worker process.

What crosses the boundary is picklable data both ways: a run's validated settings and prompt in, batches of steps
out. Everything else (the tokenizer, the views, the browser session's live state that Stop reads) stays in the app's
own process, so stopping a run closes this generator from the app's side, which ends the worker's decode.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import TimeoutError as FutureTimeout

from specviz.bench.harness import GENERATE_WARMUP_TOKENS, time_generate
from specviz.core.record import StepEvent
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import prepare
from specviz.ui.bank import shared_models
from specviz.ui.gpu import decode_seconds, gpu, observe_speed
from specviz.ui.stream import model_thread, stream_batches

BATCH_EVERY_S = 0.5
"""How often the decode hands over the steps it has (the first at once)."""


def steps_seconds(config: DecodeConfig, prompt: str, runs: int = 1) -> int:
    """The GPU time a call asks for: ``runs`` decodes of the requested tokens (ZeroGPU's ``duration``)."""
    return decode_seconds(config.max_new_tokens, runs)


@gpu(duration=steps_seconds)
def decode_steps(config: DecodeConfig, prompt: str, runs: int = 1) -> Iterator[list[StepEvent]]:
    """Decode ``prompt`` with ``config`` ``runs`` times (the first runs warm a configuration up: their steps are not
    handed over), yielding batches of the last run's steps as they come."""
    start, tokens = time.perf_counter(), 0
    for batch in stream_batches(_decode(config, prompt, runs), every_s=BATCH_EVERY_S):
        tokens += sum(len(e.emitted_ids) for e in batch)
        yield batch
    observe_speed(tokens, time.perf_counter() - start)


def _decode(config: DecodeConfig, prompt: str, runs: int) -> Iterator:
    """The last of ``runs`` decodes' steps. A generator, so all of it (preparing included) runs in the thread that
    drains it: one thread does a decode's tensor work, as in the CLI, and no other thread's OpenMP team competes with
    its own for the cores."""
    bank = shared_models().bank
    for _ in range(runs - 1):
        for _ in prepare(config, prompt, bank).events():
            pass
    yield from prepare(config, prompt, bank).events()


@gpu(duration=steps_seconds)
def generate_timing(config: DecodeConfig, prompt: str) -> Iterator[dict | None]:
    """transformers' ``generate`` on ``config`` (an AR baseline's settings) after a short untimed one, timed on the
    model thread (:func:`specviz.bench.harness.time_generate`): None every ``BATCH_EVERY_S`` while it runs, so the app
    can close it (Stop), which ends the ``generate`` after its current token; then the tokens, wall seconds, tokens/s
    and ids."""
    stop = threading.Event()
    timing = model_thread().submit(time_generate, config, prompt, shared_models().bank, GENERATE_WARMUP_TOKENS, stop)
    try:
        while True:
            try:
                yield timing.result(timeout=BATCH_EVERY_S)
                return
            except FutureTimeout:
                yield None
    finally:
        stop.set()
