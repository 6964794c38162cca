"""torch's CPU thread count, chosen by timing the forwards as a decode runs them.

On a quiet machine every core pays; where another process holds one of them, each parallel region of a forward waits
for the thread that shares its core, and fewer threads run the same decode several times faster
(``results/threads_under_load_epyc.md``). Load comes and goes, so no count measured once can stay right. A
:class:`ThreadChooser` runs one count, and now and then runs a couple of forwards at the other: each model's forwards of
one row bucket (:func:`~specviz.models.backends.cpu.bucket`) are timed at both, and the faster count is kept. The first
probe comes after a couple of forwards, so a short decode on a loaded host is not spent at the wrong count. A probe waits
for both a time and a number of forwards: the time bounds how long a change of load goes unseen, the count how much of
the decode slow forwards spend probing. After a clear verdict either way the next probe waits the longest; after a
close one, a confirmation doubles the wait and a switch starts it again. Threads change rounding at most, as the
kernels do.
"""

from __future__ import annotations

import functools
import statistics
import threading
from collections import deque

import torch

from specviz.core.env import env
from specviz.core.errors import ConfigError
from specviz.models.backends.cpu import bucket

FIRST_WAIT = (0.05, 2)
"""Seconds of forwards, and forwards, before the first probe, and after a close switch."""
LONGEST_WAIT = (8.0, 128)
"""The longest wait between two probes, in both: the wait after a clear verdict, and the most a close one doubles to."""
PROBE_FORWARDS = 2
"""Forwards a probe runs at the other count."""
SWITCH = 0.85
"""The other count is kept when its forwards take at most this fraction of the running count's time: a margin that
noise does not cross."""
CLEAR = 0.7
"""A verdict is clear when the slower count's forwards take at least 1 / CLEAR times the faster's."""
RECENT = 8
"""Forwards kept per model, row bucket and count: the running count's last ones are compared with the probe's."""


class ThreadChooser:
    """Chooses between two thread counts (``counts[0]``, what torch started with, runs first) by the time of the forwards
    it observes; :meth:`observe` is the whole interface, and sets torch's count for the forwards that follow."""

    def __init__(self, counts: tuple[int, int]):
        self.counts = counts
        self.running = counts[0]
        self.wait, self.waited = FIRST_WAIT, (0.0, 0)
        self.probing = 0
        self.recent: dict[tuple[int, object], deque[float]] = {}
        self.lock = threading.Lock()

    @property
    def other(self) -> int:
        return self.counts[self.counts[0] == self.running]

    def observe(self, model: str, rows: int, seconds: float) -> None:
        """One forward of ``model`` over ``rows`` fed rows took ``seconds``; the calling thread runs the next at the
        count chosen. (torch keeps a count per thread, so the count a forward ran at is read, not assumed.)"""
        with self.lock:
            ran = torch.get_num_threads()
            self.recent.setdefault((ran, (model, bucket(rows))), deque(maxlen=RECENT)).append(seconds)
            if self.probing:
                self.probing -= 1
                if not self.probing:
                    self._settle()
            else:
                self.waited = (self.waited[0] + seconds, self.waited[1] + 1)
                if all(done >= due for done, due in zip(self.waited, self.wait)):
                    self.running = self.other
                    for key in [k for k in self.recent if k[0] == self.running]:
                        del self.recent[key]
                    self.probing = PROBE_FORWARDS
            if ran != self.running:
                torch.set_num_threads(self.running)

    def ratio(self, probed: int, home: int) -> float | None:
        """The geometric mean over the model and row buckets timed at both counts of the median time at ``probed`` over
        that at ``home``; None where the probe timed none that ``home`` had timed."""
        ratios = [statistics.median(times) / statistics.median(self.recent[(home, key)])
                  for (threads, key), times in self.recent.items() if threads == probed and (home, key) in self.recent]
        return statistics.geometric_mean(ratios) if ratios else None

    def _settle(self) -> None:
        probed, home = self.running, self.other
        ratio = self.ratio(probed, home)
        if ratio is not None and ratio <= SWITCH:
            self.wait = FIRST_WAIT
            for key in [k for k in self.recent if k[0] == home]:
                del self.recent[key]
        else:
            self.running = home
            if ratio is not None:
                self.wait = tuple(min(2 * due, most) for due, most in zip(self.wait, LONGEST_WAIT))
        if ratio is not None and not CLEAR < ratio < 1 / CLEAR:
            self.wait = LONGEST_WAIT
        self.waited = (0.0, 0)

    def describe(self) -> str:
        return f"{self.running} threads (chosen between {self.counts[0]} and {self.counts[1]} as it runs)"


@functools.cache
def thread_chooser() -> ThreadChooser | None:
    """The process's chooser, made on first use from the environment: ``SPECVIZ_TORCH_THREADS`` a number fixes the count
    (and ``OMP_NUM_THREADS`` set leaves torch's); otherwise the choice is between torch's count and half of it, where
    torch runs more than one thread. (``thread_chooser.cache_clear()`` reads the environment again.)"""
    fixed, threads = env("SPECVIZ_TORCH_THREADS"), torch.get_num_threads()
    if fixed not in ("", "auto"):
        if not fixed.isdigit() or int(fixed) < 1:
            raise ConfigError(f"SPECVIZ_TORCH_THREADS is {fixed!r}: give a number of threads (1 or more) or auto")
        torch.set_num_threads(int(fixed))
        return None
    return ThreadChooser((threads, threads // 2)) if threads > 1 and not env("OMP_NUM_THREADS") else None


def observe_forward(model: str, rows: int, seconds: float) -> None:
    """What a CPU model's cached forward reports: handed to the process's chooser, if it chooses."""
    chooser = thread_chooser()
    if chooser is not None:
        chooser.observe(model, rows, seconds)
