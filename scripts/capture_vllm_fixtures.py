"""Capture what a real vLLM server answers, for the unit tests of ``specviz generate --server`` (tests/fixtures/vllm/).

Each named run records every request specviz makes (path, JSON body) with the server's answer (a streamed answer as
its chunks), so a test can replay the server exactly; each prompt runs whole (the CLI's and the API's request) and
streamed (the app's, ``-streamed``). It also records the answers specviz refuses (n = 2, an unknown model, a summary-only server is
simulated from these). Start the server first:

    python scripts/vllm_server.py start --port 8011 --spec draft-m
    python scripts/capture_vllm_fixtures.py --url http://127.0.0.1:8011 --name draft-m
    python scripts/vllm_server.py stop --port 8011
    (the same with --spec ngram / --name ngram --speculative-config '{"method": "ngram", ...}', as start printed it)
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.api.server import server_trace  # noqa: E402
from specviz.core.errors import ServerError  # noqa: E402
from specviz.models.vllm_client import VllmClient  # noqa: E402
from specviz.runtime.config import DecodeConfig  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "vllm"
PROMPTS = {  # name: (prompt, max new tokens)
    "story": ("Write a short story about a robot who learns to paint.", 48),
    "stop": ("Reply with one word: yes or no. Is the sky blue?", 64),
}


def record(url: str) -> tuple[list[dict], type]:
    """A VllmClient subclass that appends every exchange to the returned list."""
    exchanges: list[dict] = []

    class Recording(VllmClient):
        def request(self, path: str, body: dict | None = None):
            try:
                answer = super().request(path, body)
            except ServerError as exc:
                exchanges.append({"path": path, "body": body, "error": str(exc), "status": getattr(exc, "code", None)})
                raise
            exchanges.append({"path": path, "body": body, "answer": answer})
            return answer

        def stream(self, path: str, body: dict):
            chunks: list[dict] = []
            exchanges.append({"path": path, "body": body, "chunks": chunks})
            for chunk in super().stream(path, body):
                chunks.append(chunk)
                yield chunk

    return exchanges, Recording


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--name", required=True, help="the server's speculation, as the file name says it (draft-m, ngram)")
    ap.add_argument("--speculative-config", type=json.loads, help="the server's, as start printed it (an n-gram server's "
                    "steps are placed by its rule)")
    a = ap.parse_args()
    import specviz.api.server as server_module

    exchanges, recording = record(a.url)
    server_module.VllmClient = recording  # every request of the runs below is recorded
    runs = {}
    for key, (prompt, max_new) in PROMPTS.items():
        for name, progress in ((key, None), (f"{key}-streamed", lambda ids, text: None)):
            start = len(exchanges)
            trace = server_trace(prompt, a.url, config=DecodeConfig(max_new_tokens=max_new),
                                 speculative_config=a.speculative_config, progress=progress)
            runs[name] = {"prompt": prompt, "max_new_tokens": max_new, "exchanges": exchanges[start:], "text": trace.text}
    client = recording(a.url)
    model = client.model(None)
    refused = {"n2": client.chat(model, PROMPTS["story"][0], max_tokens=8, temperature=0.7, top_p=1.0, seed=0, n=2)}
    try:
        client.chat("no-such-model", "hi", max_tokens=4, temperature=0.0, top_p=1.0, seed=0)
    except ServerError as exc:
        refused["unknown_model_error"] = str(exc)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{a.name}.json"
    path.write_text(json.dumps({"captured": datetime.now(UTC).strftime("%Y-%m-%d"), "server": a.name,
                                "command": " ".join(["python scripts/capture_vllm_fixtures.py --url URL --name", a.name, *(
                                    ["--speculative-config", f"'{json.dumps(a.speculative_config)}'"] if a.speculative_config else [])]),
                                "speculative_config": a.speculative_config,
                                "version": client.version(), "model": model, "runs": runs, "refused": refused}, indent=1))
    print(f"wrote {path.relative_to(ROOT)}: {sum(len(r['exchanges']) for r in runs.values())} exchanges")
    return 0


if __name__ == "__main__":
    sys.exit(main())
