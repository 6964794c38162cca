"""A loopback HTTP server that replays what a real vLLM server answered (tests/fixtures/vllm/, made by
scripts/capture_vllm_fixtures.py), with hooks that change an answer, cut it short, delay it or refuse a route."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm"


def captured(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def key(path: str, body: object) -> str:
    return f"{path} {json.dumps(body, sort_keys=True)}"


def events(chunks: list[dict]) -> bytes:
    """A streamed answer's chunks as the server-sent events vLLM sends."""
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


Hook = Callable[[str, dict | None, object], object]
"""(path, request body, recorded answer) -> the answer to send: a JSON value, ``bytes`` sent as they are, or
``(status, bytes)``."""


@contextmanager
def replaying(exchanges: list[dict], hook: Hook | None = None, delay_s: float = 0.0) -> Iterator[str]:
    """Serve ``exchanges`` on 127.0.0.1 (a request not recorded gets 404, as vLLM answers an unknown route) and yield
    the URL."""
    answers = {key(e["path"], e["body"]): e for e in exchanges}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, body: dict | None) -> None:
            time.sleep(delay_s)
            recorded = answers.get(key(self.path, body))
            answer: object = (404, b'{"detail":"Not Found"}') if recorded is None else (
                (recorded["status"], json.dumps({"error": {"message": recorded["error"]}}).encode()) if "error" in recorded
                else events(recorded["chunks"]) if "chunks" in recorded else recorded["answer"])
            if hook is not None:
                answer = hook(self.path, body, answer)
            status, data = answer if isinstance(answer, tuple) else (200, answer)
            data = data if isinstance(data, bytes) else json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer(None)

        def do_POST(self) -> None:
            self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a client that gave up (a timeout test) is not the server's error

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
