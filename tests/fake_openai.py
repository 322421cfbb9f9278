"""A fake OpenAI-compatible chat-completions server on 127.0.0.1, for tests and benchmarks.

It speaks the real wire protocol (JSON and server-sent-event streaming), so litellm's own HTTP
path is exercised: the provider is faked, never the code under test. Each request is answered by
the next scripted ``Reply`` (or by a ``responder`` function), and every request body is recorded.

Usage is reported as a provider with automatic prompt caching would: ``prompt_tokens`` is the
request's prompt text (tool definitions first, then the messages in order, as providers lay them
out) at 4 characters a token, and ``cached_tokens`` is the longest prefix of that text shared with
any earlier request this server answered (in whole tokens, and only when at least
``cache_min_tokens`` long: OpenAI, for one, caches nothing under 1,024). A ``Reply`` may fix
either figure instead.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer."""

    tool_calls: list[tuple[str, Any]] = field(default_factory=list)  # (name, arguments: dict or raw string)
    text: str | None = None
    status: int = 200  # an HTTP error when not 200
    error_body: dict | str | None = None
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    prompt_tokens: int | None = None  # default: the prompt text at 4 characters a token
    completion_tokens: int = 20
    cached_tokens: int | None = None  # default: the prefix shared with an earlier request


def tool_call(name: str, arguments: Any) -> Reply:
    return Reply(tool_calls=[(name, arguments)])


def text(content: str) -> Reply:
    return Reply(text=content)


def http_error(status: int, message: str = "error", delay: float = 0.0) -> Reply:
    kinds = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error",
             500: "server_error", 503: "server_error"}
    return Reply(status=status, delay=delay,
                 error_body={"error": {"message": message, "type": kinds.get(status, "error"), "code": None}})


CHARS_PER_TOKEN = 4
_BLOCK = 16  # characters per hashed block of the prefix index


def prompt_text(body: dict) -> str:
    """The request's prompt as a provider lays it out: tool definitions, then each message in order."""
    parts = [json.dumps(body.get("tools") or [], sort_keys=True, ensure_ascii=False)]
    for m in body.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):  # content parts (text blocks; cache_control marks are not text)
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<{m.get('role')}>{content or ''}")
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            parts.append(f"<call {call.get('id')}>{fn.get('name')}({fn.get('arguments')})")
        if m.get("tool_call_id"):
            parts.append(f"<for {m['tool_call_id']}>")
    return "\n".join(parts)


class PrefixCache:
    """The longest prefix a new prompt shares with any earlier one (what an automatic provider cache
    could serve). Prompts are indexed by the hash of every block-aligned prefix, so a lookup is one
    pass over the new prompt, then a character comparison within the block after the shared ones."""

    def __init__(self) -> None:
        self._prefixes: dict[bytes, list[int]] = {}  # hash of a block-aligned prefix -> prompts that have it
        self._texts: list[str] = []

    def clear(self) -> None:
        self._prefixes.clear()
        self._texts.clear()

    def add(self, text: str) -> int:
        """The shared prefix's length in characters; then remember ``text``."""
        h = hashlib.blake2b(digest_size=16)
        keys: list[bytes] = []
        aligned, holders, matching = 0, range(len(self._texts)), True
        for end in range(_BLOCK, len(text) + 1, _BLOCK):
            h.update(text[end - _BLOCK:end].encode())
            keys.append(h.copy().digest())
            if matching:
                found = self._prefixes.get(keys[-1])
                if found:
                    aligned, holders = end, found
                else:
                    matching = False
        shared = aligned
        for i in holders:
            earlier = self._texts[i]
            n, limit = aligned, min(len(text), len(earlier), aligned + _BLOCK)
            while n < limit and text[n] == earlier[n]:
                n += 1
            shared = max(shared, n)
        index = len(self._texts)
        self._texts.append(text)
        for key in keys:
            self._prefixes.setdefault(key, []).append(index)
        return shared


class FakeOpenAI:
    """``with FakeOpenAI() as server:`` then point litellm at ``server.base_url``."""

    def __init__(self, replies: list[Reply] | None = None,
                 responder: Callable[[dict], Reply] | None = None, default: Reply | None = None,
                 cache_min_tokens: int = 0) -> None:
        self.replies: list[Reply] = list(replies or [])
        self.cache = PrefixCache()
        self.cache_min_tokens = cache_min_tokens
        self.responder = responder
        self.default = default
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def reset(self) -> None:
        """Forget replies, requests and any responder: a clean server for the next test."""
        with self.lock:
            self.replies.clear()
            self.requests.clear()
            self.responder = None
            self.default = None
            self.cache.clear()

    # ---------------------------------------------------------- lifecycle

    def __enter__(self) -> FakeOpenAI:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once, as real servers do

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                fake._handle(self, body)

            def do_GET(self) -> None:  # noqa: N802
                self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # a client that hung up (a timeout the test set, a killed run) is no error of the fake's;
                # socketserver's default prints a traceback to whatever stderr is current, another
                # test's captured one included
                if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                    super().handle_error(request, client_address)

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "server not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    # ---------------------------------------------------------- scripting

    def add(self, *replies: Reply) -> None:
        with self.lock:
            self.replies.extend(replies)

    def _next(self, body: dict) -> tuple[Reply, int, int]:
        """The reply, the prompt's tokens, and how many of them an earlier request's prefix covers."""
        text_value = prompt_text(body)
        with self.lock:
            shared = self.cache.add(text_value)
        prompt_tokens = max(1, math.ceil(len(text_value) / CHARS_PER_TOKEN))
        cached = shared // CHARS_PER_TOKEN
        return self._scripted(body), prompt_tokens, cached if cached >= self.cache_min_tokens else 0

    def _scripted(self, body: dict) -> Reply:
        with self.lock:
            self.requests.append(body)
            if self.responder is not None:
                return self.responder(body)
            if self.replies:
                return self.replies.pop(0)
            if self.default is not None:
                return self.default
        return Reply(text="(no scripted reply left)")

    def sent_text(self) -> str:
        """Everything every request sent, as one string (to look for leaked secrets)."""
        return "\n".join(json.dumps(r, ensure_ascii=False) for r in self.requests)

    # ---------------------------------------------------------- answering

    def _handle(self, handler: BaseHTTPRequestHandler, body: dict) -> None:
        reply, prompt_tokens, cached_tokens = self._next(body)
        if reply.delay:
            time.sleep(reply.delay)
        if reply.status != 200:
            payload = reply.error_body if reply.error_body is not None else {"error": {"message": "error"}}
            data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
            handler.send_response(reply.status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            for k, v in reply.headers.items():
                handler.send_header(k, v)
            handler.end_headers()
            handler.wfile.write(data)
            return
        if reply.prompt_tokens is not None:
            prompt_tokens = reply.prompt_tokens
        if reply.cached_tokens is not None:
            cached_tokens = reply.cached_tokens
        cached_tokens = min(cached_tokens, prompt_tokens)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": reply.completion_tokens,
                 "total_tokens": prompt_tokens + reply.completion_tokens,
                 "prompt_tokens_details": {"cached_tokens": cached_tokens}}
        calls = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                  "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                 for name, args in reply.tool_calls]
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else "stop"
        created = int(time.time())
        rid = f"chatcmpl-{uuid.uuid4().hex[:16]}"
        model = body.get("model", "fake-model")
        if body.get("stream"):
            self._stream(handler, rid, created, model, message, finish, usage)
            return
        payload = {"id": rid, "object": "chat.completion", "created": created, "model": model,
                   "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}
        data = json.dumps(payload).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _stream(self, handler, rid, created, model, message, finish, usage) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()

        def chunk(delta: dict, finish_reason: str | None = None, with_usage: bool = False) -> None:
            payload: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created,
                                       "model": model, "choices": [{"index": 0, "delta": delta,
                                                                    "finish_reason": finish_reason}]}
            if with_usage:
                payload["usage"] = usage
            handler.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            handler.wfile.flush()

        chunk({"role": "assistant", "content": ""})
        if message.get("content"):
            text_value = message["content"]
            half = len(text_value) // 2
            for part in (text_value[:half], text_value[half:]):
                if part:
                    chunk({"content": part})
        for i, call in enumerate(message.get("tool_calls", [])):
            args = call["function"]["arguments"]
            half = len(args) // 2
            chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                   "function": {"name": call["function"]["name"], "arguments": args[:half]}}]})
            chunk({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]})
        chunk({}, finish, with_usage=True)
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()
        handler.close_connection = True
