"""Run a decode on the process's one model thread and hand its events to the UI in batches.

The engine keeps its own pace (rendering never pauses it between steps, so the measured tokens/s is the
engine's), the first event is handed over at once, later ones at most every ``every_s`` seconds.
Closing the batch generator (gradio does so on Stop) tells the worker to stop after its current step.

Every model's tensor work (loading and decoding) runs on one thread, :func:`model_thread`, as in the CLI: each
thread that computes gets its own OpenMP team, and once a process has more team threads than cores, libgomp
stops spinning between parallel regions, which made a decode about 40 % slower on 2 cores.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
_DONE = object()
_executor: tuple[int, ThreadPoolExecutor] | None = None
_executor_lock = threading.Lock()


def model_thread() -> ThreadPoolExecutor:
    """The one thread of this process that runs models (made again in a forked process, e.g. a ZeroGPU worker,
    which inherits no threads)."""
    global _executor
    with _executor_lock:
        if _executor is None or _executor[0] != os.getpid():
            _executor = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="specviz-model"))
        return _executor[1]


def on_model_thread(fn: Callable[..., T], *args) -> T:
    """``fn(*args)``, run on the model thread (after what it is running now; at once when called there)."""
    if threading.current_thread().name.startswith("specviz-model"):
        return fn(*args)
    return model_thread().submit(fn, *args).result()


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
    """Batches of events as they arrive: the first at once, then at most one batch per ``every_s``. ``events`` is
    iterated on the model thread (a generator's body runs there, so it may load and prepare as well)."""
    items: queue.Queue = queue.Queue()
    stop = threading.Event()
    model_thread().submit(_drain, events, items, stop)
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
