"""An OpenAI-compatible vLLM server as a source of runs: its models, its version, one chat completion with the
token ids and the per-request speculative-decoding metrics (``--per-request-spec-decode-metrics detailed``), whole or
streamed (the metrics then come in the final usage chunk), and the text of token ids (``/detokenize``). Standard
library only.

Everything the server sends is data: a body that is not JSON, too large, or not the shape vLLM answers with raises
a one-line :class:`~specviz.core.errors.ServerError`, as does a server that does not answer in time.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
        with self._open(path, body) as r:
            raw = r.read(MAX_BODY_BYTES + 1)
        if len(raw) > MAX_BODY_BYTES:
            raise ServerError(f"{self.url}{path} sent more than {MAX_BODY_BYTES // 2**20} MB")
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ServerError(f"{self.url}{path} did not answer with JSON ({str(exc).splitlines()[0][:80]}): "
                              "is this a vLLM server?") from None

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        """POST ``body`` and yield each JSON chunk of the server-sent events it answers with, up to ``[DONE]``."""
        size = 0
        with self._open(path, body) as r:
            for raw in r:
                size += len(raw)
                if size > MAX_BODY_BYTES:
                    raise ServerError(f"{self.url}{path} streamed more than {MAX_BODY_BYTES // 2**20} MB")
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):  # the blank line between events, a comment
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    raise ServerError(f"{self.url}{path} streamed a chunk that is not JSON: is this a vLLM server?") from None
                if not isinstance(chunk, dict):
                    raise ServerError(f"{self.url}{path} streamed a chunk that is not a JSON object")
                if "error" in chunk:
                    error = chunk["error"]
                    message = error.get("message") if isinstance(error, dict) else error
                    raise ServerError(f"{self.url}{path} failed while streaming: {str(message).splitlines()[0][:200]}")
                yield chunk
        raise ServerError(f"{self.url}{path}: the stream ended before its final [DONE]")

    @contextmanager
    def _open(self, path: str, body: dict | None) -> Iterator[http.client.HTTPResponse]:
        """The response to GET ``path`` (POST ``body``), its failures, reading included, as one-line ServerErrors."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                yield r
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

    def chat_streamed(self, model: str, prompt: str, *, max_tokens: int, temperature: float, top_p: float, seed: int,
                      on_tokens: Callable[[list[int], str], None]) -> dict:
        """:meth:`chat`, streamed: ``on_tokens(ids, text)`` with the answer so far after each chunk that adds to it. Returns
        the body a whole answer has, its usage and metrics (the speculation among them) from the final usage chunk."""
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p, "seed": seed, "n": 1, "return_token_ids": True,
                "stream": True, "stream_options": {"include_usage": True}}
        prompt_ids, ids, text, finish, final = None, [], "", None, {}
        for chunk in self.stream("/v1/chat/completions", body):
            prompt_ids = chunk.get("prompt_token_ids", prompt_ids)  # vLLM sends them with the first chunk
            choices = chunk.get("choices")
            if not isinstance(choices, list):
                raise ServerError("a streamed chunk has no choices: is this an OpenAI chat completion?")
            for choice in choices:
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    raise ServerError("the server streamed more than one choice: per-request speculation is reported for "
                                      "n = 1 only")
                delta, new = choice.get("delta") or {}, choice.get("token_ids") or []
                if not isinstance(new, list) or not isinstance(delta, dict) or not isinstance(delta.get("content") or "", str):
                    raise ServerError("a streamed chunk's token ids or text are not as vLLM streams them")
                ids, text = ids + new, text + (delta.get("content") or "")
                finish = choice.get("finish_reason") or finish
            if chunk.get("usage") is not None:
                final = chunk
            if choices:
                on_tokens(ids, text)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "token_ids": ids,
                             "finish_reason": finish}],
                "prompt_token_ids": prompt_ids, "usage": final.get("usage"), "metrics": final.get("metrics")}

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
