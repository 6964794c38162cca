"""Phase timing that never stalls the device for the clock's sake.

On a CPU a mark is ``time.perf_counter()``. On CUDA a mark is an event recorded on the current stream: marking
costs no synchronisation, and the seconds between two marks are read once the later one has completed, which the
step's one necessary host read (the accept decision) already guarantees; reading waits on that event alone.
"""

from __future__ import annotations

import time

import torch

Mark = float | torch.cuda.Event


class Stopwatch:
    """Marks and the seconds between them on one device."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self) -> Mark:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Mark, end: Mark) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return end - start


class ForwardTimes:
    """Forward count and seconds of one model; on CUDA the seconds are summed from event pairs when read."""

    def __init__(self, device: torch.device):
        self.watch, self.forwards, self._seconds, self._pending = Stopwatch(device), 0, 0.0, []

    def start(self) -> Mark:
        return self.watch.mark()

    def stop(self, start: Mark) -> float | None:
        """Count the forward begun at ``start``; its seconds on a CPU (None on CUDA, where reading would wait)."""
        self.forwards += 1
        end = self.watch.mark()
        if self.watch.cuda:
            self._pending.append((start, end))
            return None
        self._seconds += end - start
        return end - start

    @property
    def seconds(self) -> float:
        for start, end in self._pending:
            self._seconds += self.watch.seconds(start, end)
        self._pending.clear()
        return self._seconds


class Timed:
    """What the engine reads from every model it times: ``forwards`` and ``forward_s`` from ``times``."""

    times: ForwardTimes

    @property
    def forwards(self) -> int:
        return self.times.forwards

    @property
    def forward_s(self) -> float:
        return self.times.seconds
