"""An OpenAI-compatible vLLM server as a source of runs: its models, its version, one chat completion with the
token ids and the per-request speculative-decoding metrics (``--per-request-spec-decode-metrics detailed``), and the
text of token ids (``/detokenize``). Standard library only.

Everything the server sends is data: a body that is not JSON, too large, or not the shape vLLM answers with raises
a one-line :class:`~specviz.core.errors.ServerError`, as does a server that does not answer in time.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from specviz.core.errors import ServerError

MAX_BODY_BYTES = 16 * 2**20
DEFAULT_TIMEOUT_S = 300.0


class HTTPStatusError(ServerError):
    """The server answered with an HTTP error status (``code``)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def normalized_url(url: str) -> str:
    """``url`` without a trailing ``/`` or ``/v1``; a one-line ServerError unless it is an http(s) URL with a host."""
    url = (url or "").strip().rstrip("/")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerError(f"server URL must be http(s)://host[:port], got {url!r}")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class VllmClient:
    """One vLLM server, reached at ``url`` (``http://host:port``, with or without ``/v1``)."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT_S):
        self.url, self.timeout = normalized_url(url), timeout

    def request(self, path: str, body: dict | None = None) -> Any:
        """GET ``path`` (POST ``body`` as JSON when given) and return the decoded JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read(MAX_BODY_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise HTTPStatusError(f"{self.url}{path} answered HTTP {exc.code}: {error_message(exc)}", exc.code) from None
        except TimeoutError:
            raise ServerError(f"{self.url}{path} did not answer within {self.timeout:g} s") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise ServerError(f"{self.url}{path} did not answer within {self.timeout:g} s") from None
            raise ServerError(f"no server answers at {self.url}: {exc.reason}") from None
        except (OSError, ValueError, http.client.HTTPException) as exc:  # a body cut short, a malformed status line
            raise ServerError(f"{self.url}{path}: the connection failed ({type(exc).__name__}: {exc})") from None
        if len(raw) > MAX_BODY_BYTES:
            raise ServerError(f"{self.url}{path} sent more than {MAX_BODY_BYTES // 2**20} MB")
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ServerError(f"{self.url}{path} did not answer with JSON ({str(exc).splitlines()[0][:80]}): "
                              "is this a vLLM server?") from None

    def _route(self, path: str, absent: str):
        """The JSON body of GET ``path``; a server without the route raises a ServerError saying ``absent``."""
        try:
            return self.request(path)
        except HTTPStatusError as exc:
            if exc.code in (404, 405):
                raise ServerError(f"{self.url} has no {path}: {absent}") from None
            raise

    def served_models(self) -> list[str]:
        """The model names the server serves (``/v1/models``)."""
        body = self._route("/v1/models", "it is not an OpenAI-compatible API such as vLLM's")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            raise ServerError(f"{self.url}/v1/models is not an OpenAI model list: is this a vLLM server?")
        return [m["id"] for m in data]

    def version(self) -> str:
        """vLLM's version (``/version``): another OpenAI-compatible server has no such route."""
        body = self._route("/version", "it is an OpenAI-compatible API, but not vLLM's")
        if not isinstance(body, dict) or not isinstance(body.get("version"), str):
            raise ServerError(f"{self.url}/version does not name a vLLM version: is this a vLLM server?")
        return body["version"]

    def model(self, name: str | None) -> str:
        """``name`` if the server serves it; None: the server's only model."""
        served = self.served_models()
        if name is None:
            if len(served) != 1:
                raise ServerError(f"{self.url} serves {len(served)} models: name one ({', '.join(served[:5])})")
            return served[0]
        if name not in served:
            raise ServerError(f"{self.url} does not serve model {name!r}; it serves: {', '.join(served[:5]) or 'none'}")
        return name

    def chat(self, model: str, prompt: str, *, max_tokens: int, temperature: float, top_p: float, seed: int,
             n: int = 1) -> dict:
        """One chat completion of ``prompt`` (a user message), with the prompt's and the answer's token ids."""
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p, "seed": seed, "n": n, "return_token_ids": True,
                "stream": False}
        answer = self.request("/v1/chat/completions", body)
        if not isinstance(answer, dict):
            raise ServerError(f"{self.url}/v1/chat/completions did not answer with a JSON object")
        return answer

    def decode(self, model: str, ids: list[int]) -> str:
        """The text of ``ids`` in the server's tokenizer (``/detokenize``)."""
        body = self.request("/detokenize", {"model": model, "tokens": [int(i) for i in ids]})
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise ServerError(f"{self.url}/detokenize did not answer with a text")
        return body["prompt"]


def error_message(exc: urllib.error.HTTPError) -> str:
    """The first line of an error body's message (vLLM's ``{"error": {"message": ...}}``), or the HTTP reason."""
    try:
        body = json.loads(exc.read(64 * 1024))
        message = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else body.get("message")
        if isinstance(message, str) and message.strip():
            return message.strip().splitlines()[0][:200]
    except (OSError, ValueError, AttributeError):
        pass
    return str(exc.reason)[:200]


class ServerTokenizer:
    """The server's tokenizer where a run's views need one: ``decode`` and ``batch_decode`` through ``/detokenize``
    (each distinct request asked once)."""

    def __init__(self, client: VllmClient, model: str):
        self.client, self.model, self.cache = client, model, {}

    def decode(self, ids: list[int], skip_special_tokens: bool = False, **_: Any) -> str:
        key = tuple(int(i) for i in ids)
        if not key:
            return ""
        if key not in self.cache:
            self.cache[key] = self.client.decode(self.model, list(key))
        return self.cache[key]

    def batch_decode(self, rows: list[list[int]], **kw: Any) -> list[str]:
        return [self.decode(row, **kw) for row in rows]
