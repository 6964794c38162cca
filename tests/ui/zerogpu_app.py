"""Serve the app under a fake ``spaces`` module that behaves like ZeroGPU, for tests/ui/test_zerogpu.py.

- A decorated call runs in a forked process; its arguments and what it returns or yields cross as pickles, and no
  tensor may cross.
- ``duration`` must be an int, or a callable of the call's arguments returning one, between 1 and 300.
- Any CUDA initialisation in the app's own process raises.
- Closing a decorated generator from the app's side ends its worker process.

Usage: python tests/ui/zerogpu_app.py PORT STATUS_FILE (writes the workers' pids and the GPU calls' durations there).
"""

import inspect
import json
import multiprocessing
import os
import pickle
import sys
import threading
import types
from pathlib import Path

import torch

MAIN = os.getpid()
_real_lazy_init = torch.cuda._lazy_init


def _guarded_lazy_init(*args, **kwargs):
    if os.getpid() == MAIN:
        raise RuntimeError("CUDA was initialised in the app's process: every CUDA computation belongs in a @spaces.GPU call")
    return _real_lazy_init(*args, **kwargs)


torch.cuda._lazy_init = _guarded_lazy_init
WORKERS: list = []
DURATIONS: list[int] = []


def no_tensors(value, where: str) -> None:
    if isinstance(value, torch.Tensor):
        raise TypeError(f"a tensor crossed the GPU process boundary in {where}")
    if isinstance(value, dict):
        for v in value.values():
            no_tensors(v, where)
    elif isinstance(value, list | tuple):
        for v in value:
            no_tensors(v, where)


def _child(fn, payload: bytes, conn) -> None:
    torch.set_num_threads(1)
    args, kwargs = pickle.loads(payload)
    try:
        result = fn(*args, **kwargs)
        for item in (result if inspect.isgenerator(result) else [result]):
            no_tensors(item, fn.__name__)
            conn.send(("item", pickle.dumps(item)))
        conn.send(("done", None))
    except BaseException as exc:  # sent to the app's side, where the call raises it
        conn.send(("error", pickle.dumps(exc)))


def _start(fn, duration, args, kwargs):
    seconds = duration(*args, **kwargs) if callable(duration) else (60 if duration is None else duration)
    if not isinstance(seconds, int) or not 1 <= seconds <= 300:
        raise ValueError(f"duration must be an int in 1..300, got {seconds!r}")
    DURATIONS.append(seconds)
    no_tensors((args, kwargs), fn.__name__)
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    process = ctx.Process(target=_child, args=(fn, pickle.dumps((args, kwargs)), there), daemon=True)
    process.start()
    WORKERS.append(process)
    return here, process


def GPU(fn=None, *, duration=None):  # noqa: N802 (the real module's name)
    def wrap(f):
        def receive(here, process):
            try:
                while True:
                    kind, data = here.recv()
                    if kind == "done":
                        return
                    if kind == "error":
                        raise pickle.loads(data)
                    yield pickle.loads(data)
            finally:  # a generator closed early (Stop) ends its worker
                if process.is_alive():
                    process.terminate()
                process.join(10)

        if inspect.isgeneratorfunction(f):
            def generator(*args, **kwargs):
                yield from receive(*_start(f, duration, args, kwargs))
            return generator

        def call(*args, **kwargs):
            return next(iter(list(receive(*_start(f, duration, args, kwargs)))))
        return call
    return wrap(fn) if fn is not None else wrap


sys.modules["spaces"] = types.SimpleNamespace(GPU=GPU)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specviz.ui.app import build_app, launch  # noqa: E402


def report(path: Path) -> None:
    def write():
        while True:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"alive": [p.pid for p in WORKERS if p.is_alive()], "workers": len(WORKERS),
                                       "durations": DURATIONS}))
            tmp.replace(path)  # readers never see a half-written file
            threading.Event().wait(0.2)
    threading.Thread(target=write, daemon=True).start()


if __name__ == "__main__":
    report(Path(sys.argv[2]))
    launch(build_app(), warm_up=True, server_name="127.0.0.1", server_port=int(sys.argv[1]), quiet=True)
