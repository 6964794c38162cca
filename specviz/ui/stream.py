"""Run a decode in a worker thread and hand its events to the UI in batches.

The engine keeps its own pace (rendering never pauses it between steps, so the measured tokens/s is the
engine's), the first event is handed over at once, later ones at most every ``every_s`` seconds.
Closing the batch generator (gradio does so on Stop) tells the worker to stop after its current step.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


def _drain(events: Iterator, items: queue.Queue, stop: threading.Event) -> None:
    try:
        for event in events:
            items.put(event)
            if stop.is_set():
                break
    except BaseException as exc:  # handed to the consumer, which raises it in the handler's thread
        items.put(_Failure(exc))
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
        items.put(_DONE)


def stream_batches(events: Iterator[T], every_s: float = 0.08, poll_s: float = 0.25) -> Iterator[list[T]]:
    """Batches of events as they arrive: the first at once, then at most one batch per ``every_s``."""
    items: queue.Queue = queue.Queue()
    stop = threading.Event()
    worker = threading.Thread(target=_drain, args=(events, items, stop), name="specviz-decode", daemon=True)
    worker.start()
    pending: list[T] = []
    next_flush = 0.0
    try:
        while True:
            wait = poll_s if not pending else max(0.0, next_flush - time.perf_counter())
            try:
                item = items.get(timeout=wait)
            except queue.Empty:
                item = None
            if item is _DONE:
                break
            if isinstance(item, _Failure):
                if pending:
                    yield pending
                raise item.exc
            if item is not None:
                pending.append(item)
            if pending and time.perf_counter() >= next_flush:
                yield pending
                pending = []
                next_flush = time.perf_counter() + every_s
        if pending:
            yield pending
    finally:
        stop.set()
