"""Fixtures of the UI tests: one app launched on a free localhost port for the whole session.

Torch runs on one thread here: the machine has two cores and other jobs, and oversubscribed threads
make every forward many times slower.
"""

import os
import socket

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def app_url():
    import torch

    from specviz.ui.app import build_app, launch

    torch.set_num_threads(1)
    demo = build_app()
    port = free_port()
    launch(demo, warm_up=True, prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture()
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)
