"""torch's CPU thread count, chosen by timing the forwards as a decode runs them.

On a quiet machine every core pays; where another process holds one of them, each parallel region of a forward waits
for the thread that shares its core, and fewer threads run the same decode several times faster
(``results/threads_under_load_epyc.md``). Load comes and goes, so no count measured once can stay right. A
:class:`ThreadChooser` runs one count, and now and then runs a couple of forwards at the other: each model's forwards of
one row bucket (:func:`~specviz.models.backends.cpu.bucket`) are timed at both, each kind weighed by the time it took
since the last probe (a chain's many short drafts do not outvote its verifies), and the faster count is kept. The first
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
from specviz.models.backends.cpu import FIRST_OF_LAST, bucket

FIRST_WAIT = (0.05, 2)
"""Seconds of forwards, and forwards, before the first probe, and after a close switch."""
LONGEST_WAIT = (8.0, 128)
"""The longest wait between two probes, in both: the wait after a clear verdict, and the most a close one doubles to."""
PROBE_FORWARDS = (2, 16)
"""The fewest and the most forwards a probe runs at the other count: past the fewest it runs on until the forwards it
timed are of the kinds that took most of the time since the last probe (a chain drafts several times per verify)."""
COVER = 0.5
"""The share of that time the kinds a probe timed must have taken for its verdict to count."""
SWITCH = 0.85
"""The other count is kept when its forwards would take at most this fraction of the running count's time: a margin
that noise does not cross."""
CLEAR = 0.75
"""A verdict is clear when the slower count's forwards take at least 1 / CLEAR times the faster's."""
RECENT = 8
"""Forwards kept per model, row bucket and count: the running count's last ones are compared with the probe's."""


class ThreadChooser:
    """Chooses between two thread counts (``counts[0]``, what torch started with, runs first) by the time of the forwards
    it observes; :meth:`observe` is the whole interface, and sets torch's count for the forwards that follow. A kind of
    forward is a model and a row bucket; forwards of the last bucket (prefills) come once a decode and are left out."""

    def __init__(self, counts: tuple[int, int]):
        self.counts = counts
        self.running = counts[0]
        self.wait, self.waited = FIRST_WAIT, (0.0, 0)
        self.probed: int | None = None  # forwards run so far by the probe under way
        self.recent: dict[tuple[int, object], deque[float]] = {}
        self.spent: dict[object, float] = {}  # seconds per kind of forward since the last probe
        self.lock = threading.Lock()

    @property
    def other(self) -> int:
        return self.counts[self.counts[0] == self.running]

    def observe(self, model: str, rows: int, seconds: float) -> None:
        """One forward of ``model`` over ``rows`` fed rows took ``seconds``; the calling thread runs the next at the
        count chosen. (torch keeps a count per thread, so the count a forward ran at is read, not assumed.)"""
        with self.lock:
            ran = torch.get_num_threads()
            if rows < FIRST_OF_LAST:
                self._count((model, bucket(rows)), ran, seconds)
            if ran != self.running:
                torch.set_num_threads(self.running)

    def _count(self, kind: object, ran: int, seconds: float) -> None:
        self.recent.setdefault((ran, kind), deque(maxlen=RECENT)).append(seconds)
        if self.probed is not None:
            self.probed += 1
            fewest, most = PROBE_FORWARDS
            if self.probed >= most or (self.probed >= fewest and self.covered() >= COVER):
                self._settle()
            return
        self.spent[kind] = self.spent.get(kind, 0.0) + seconds
        self.waited = (self.waited[0] + seconds, self.waited[1] + 1)
        if all(done >= due for done, due in zip(self.waited, self.wait)):
            self.running, self.probed = self.other, 0
            for key in [k for k in self.recent if k[0] == self.running]:
                del self.recent[key]

    def covered(self) -> float:
        """The share of the time since the last probe spent in kinds of forward the probe under way has timed."""
        timed = sum(t for kind, t in self.spent.items() if (self.running, kind) in self.recent)
        return timed / max(sum(self.spent.values()), 1e-12)

    def ratio(self, probed: int, home: int) -> float | None:
        """The time the forwards since the last probe would have taken at ``probed`` over what they took at ``home``, from
        each kind's median time at both, over the kinds timed at both; None where there are none."""
        kinds = [kind for kind in self.spent if (probed, kind) in self.recent and (home, kind) in self.recent]
        if not kinds:
            return None
        return sum(self.spent[k] * statistics.median(self.recent[(probed, k)]) / statistics.median(self.recent[(home, k)])
                   for k in kinds) / sum(self.spent[k] for k in kinds)

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
        self.waited, self.probed = (0.0, 0), None
        self.spent.clear()

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
