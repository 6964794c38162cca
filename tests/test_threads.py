"""The CPU thread count chosen by timing the forwards: it follows the faster count on made-up forward times (a busy core,
a quiet machine, load that comes and goes, noise), costs a bounded share of the forwards where it keeps the count, reads
the environment with a clear error, and a decode whose count changes every few forwards still emits transformers'
greedy tokens."""

import math
import random

import pytest
import torch

from specviz.core.errors import ConfigError
from specviz.models.backends import threads
from specviz.models.backends.threads import LONGEST_WAIT, ThreadChooser, thread_chooser
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import prepare

PROBE_FORWARDS = threads.PROBE_FORWARDS[0]  # a probe's length where one kind of forward takes all the time
QUIET = {2: 0.030, 1: 0.044}  # the ratio measured on a quiet 2-core machine (1 thread: 0.68x the speed of 2)
BUSY = {2: 0.110, 1: 0.045}  # and beside a busy core (2.5x)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def forwards(chooser: ThreadChooser, seconds: float, cost, model: str = "target", rows: int = 1) -> list[int]:
    """Forwards for ``seconds`` of forward time, each taking ``cost(torch's count)``; the count each ran at."""
    ran, spent = [], 0.0
    while spent < seconds:
        ran.append(torch.get_num_threads())
        took = cost(ran[-1])
        chooser.observe(model, rows, took)
        spent += took
    return ran


def test_beside_a_busy_core_one_thread_is_chosen_after_the_first_probe(two_threads):
    chooser = ThreadChooser((2, 1))
    ran = forwards(chooser, 60, BUSY.get)
    first = ran.index(1)
    assert set(ran[:first]) == {2} and first == max(threads.FIRST_WAIT[1], math.ceil(threads.FIRST_WAIT[0] / BUSY[2]))
    assert len(ran) / (60 / BUSY[1]) > 0.95, "within 5 % of the forwards one thread alone would run"
    assert chooser.running == 1 and torch.get_num_threads() == 1


def probe_starts(ran: list[int], home: int) -> list[int]:
    return [i for i in range(1, len(ran)) if ran[i] != home and ran[i - 1] == home]


def test_on_a_quiet_machine_one_clear_probe_settles_it(two_threads):
    chooser = ThreadChooser((2, 1))
    ran = forwards(chooser, 120, QUIET.get)
    probes = probe_starts(ran, 2)
    assert all(ran[i:i + PROBE_FORWARDS] == [1] * PROBE_FORWARDS and ran[i + PROBE_FORWARDS] == 2 for i in probes)
    longest = PROBE_FORWARDS + max(LONGEST_WAIT[1], math.ceil(LONGEST_WAIT[0] / QUIET[2]))
    assert probes[0] == threads.FIRST_WAIT[1] and {b - a for a, b in zip(probes, probes[1:])} == {longest}
    assert len(ran) / (120 / QUIET[2]) > 0.99, "probing costs under 1 % of the forwards two threads alone would run"
    assert chooser.running == 2


def test_a_close_verdict_doubles_the_wait(two_threads):
    chooser = ThreadChooser((2, 1))
    ran = forwards(chooser, 120, {2: 0.030, 1: 0.033}.get)
    probes = probe_starts(ran, 2)
    gaps = [b - a - PROBE_FORWARDS for a, b in zip(probes, probes[1:])]
    assert gaps[:3] == [4, 8, 16] and gaps[-1] == max(LONGEST_WAIT[1], math.ceil(LONGEST_WAIT[0] / 0.030))
    assert chooser.running == 2


def test_the_count_follows_load_that_comes_and_goes(two_threads):
    chooser = ThreadChooser((2, 1))
    for load, faster in ((QUIET, 2), (BUSY, 1), (QUIET, 2), (BUSY, 1)):
        ran = forwards(chooser, 40, load.get)
        settled = ran[-(len(ran) // 2):]  # the later half: the change was seen within the longest wait
        assert settled.count(faster) / len(settled) > 0.97, (load, faster)


def test_noisy_forwards_do_not_make_it_switch_on_a_quiet_machine(two_threads):
    chooser, draw = ThreadChooser((2, 1)), random.Random(0)
    ran = forwards(chooser, 120, lambda n: QUIET[n] * draw.lognormvariate(0, 0.25))
    assert ran.count(1) / len(ran) < 0.02


def chain(chooser: ThreadChooser, steps: int, draft: dict, verify: dict, drafts: int = 3) -> tuple[float, float]:
    """``steps`` of a chain: ``drafts`` 1-row draft forwards, then a 4-row verify; the seconds they took, and what they
    would have taken at two threads."""
    spent = at_two = 0.0
    for _ in range(steps):
        for model, rows, cost in [("draft", 1, draft)] * drafts + [("target", 4, verify)]:
            ran = torch.get_num_threads()
            chooser.observe(model, rows, cost[ran])
            spent, at_two = spent + cost[ran], at_two + cost[2]
    return spent, at_two


def test_forwards_are_compared_per_model_and_row_count(two_threads):
    """A draft's short forwards and the target's verifies interleave: a probe's two drafts are set against the drafts'
    times, not against a mean that holds the verifies too (which would make one thread look faster)."""
    chooser = ThreadChooser((2, 1))
    spent, at_two = chain(chooser, 2000, {n: t / 10 for n, t in QUIET.items()}, QUIET, drafts=1)
    assert at_two / spent > 0.99 and chooser.running == 2


def test_each_kind_weighs_by_the_time_it_takes(two_threads):
    """Drafts a little faster at one thread, verifies much faster at two: the verifies take most of the time, so two
    threads stay, and a probe that has timed only drafts runs on until it has timed a verify."""
    chooser = ThreadChooser((2, 1))
    spent, at_two = chain(chooser, 2000, {2: 0.0012, 1: 0.0010}, QUIET, drafts=6)
    assert at_two / spent > 0.99 and chooser.running == 2


def test_prefills_neither_count_nor_decide(two_threads):
    chooser = ThreadChooser((2, 1))
    for _ in range(50):
        chooser.observe("target", 200, 5.0)
    assert chooser.recent == {} and chooser.probed is None and torch.get_num_threads() == 2


@pytest.mark.parametrize("value, threads_after, chooses", [("3", 3, False), ("auto", 2, True), ("", 2, True), ("1", 1, False)])
def test_the_environment_fixes_the_count_or_lets_it_be_chosen(monkeypatch, two_threads, value, threads_after, chooses):
    monkeypatch.setenv("SPECVIZ_TORCH_THREADS", value)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    thread_chooser.cache_clear()
    try:
        chooser = thread_chooser()
        assert (chooser is not None) == chooses and torch.get_num_threads() == threads_after
        assert chooser is None or chooser.counts == (2, 1)
    finally:
        thread_chooser.cache_clear()


def test_omp_num_threads_or_a_single_thread_leaves_torch_s_count(monkeypatch, two_threads):
    monkeypatch.delenv("SPECVIZ_TORCH_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    thread_chooser.cache_clear()
    try:
        assert thread_chooser() is None and torch.get_num_threads() == 2
        monkeypatch.delenv("OMP_NUM_THREADS")
        torch.set_num_threads(1)
        thread_chooser.cache_clear()
        assert thread_chooser() is None
    finally:
        thread_chooser.cache_clear()


@pytest.mark.parametrize("value", ["two", "0", "-1", "1.5"])
def test_a_bad_thread_count_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv("SPECVIZ_TORCH_THREADS", value)
    thread_chooser.cache_clear()
    try:
        with pytest.raises(ConfigError, match="SPECVIZ_TORCH_THREADS is .*give a number of threads"):
            thread_chooser()
    finally:
        thread_chooser.cache_clear()


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{"method": "ar"}, {"draft": "draft-m", "gamma": 3, "gamma_policy": "fixed"}, {}],
                         ids=["ar", "draft-m", "defaults"])
def test_a_decode_whose_count_changes_every_few_forwards_emits_generate_s_tokens(bank, monkeypatch, two_threads, settings):
    for wait in ("FIRST_WAIT", "LONGEST_WAIT"):  # a probe after every forward, settled or not: the count keeps changing
        monkeypatch.setattr(threads, wait, (0.0, 1))
    chooser, seen = ThreadChooser((2, 1)), []
    observe = chooser.observe
    monkeypatch.setattr(chooser, "observe", lambda *a: (seen.append(torch.get_num_threads()), observe(*a)))
    monkeypatch.setattr(threads, "thread_chooser", lambda: chooser)
    run = prepare(DecodeConfig(max_new_tokens=48, **settings), "Name three uses of a paperclip.", bank)
    tokens = [t for e in run.events(record=False) for t in e.emitted_ids]
    assert seen.count(1) > 5 and seen.count(2) > 5
    ids = torch.tensor([run.prompt_ids])
    with torch.inference_mode():
        reference = run.target.lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=48,
                                                 eos_token_id=run.stop_ids, pad_token_id=run.stop_ids[0])
    assert tokens == reference[0, ids.shape[1]:].tolist()[:len(tokens)] and len(tokens) > 0
