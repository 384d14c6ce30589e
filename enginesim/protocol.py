"""OpenAI-compatible request validation and response shapes, as vLLM's OpenAI server writes them.

Pure functions from JSON bodies to ``GenerationRequest`` (or an ``ApiError``) and from tokens to chunks.
Errors use vLLM's ``ErrorResponse`` body: ``{"error": {"message", "type", "param", "code"}}``; an unknown
model name is 404 ``NotFoundError`` as in vLLM's ``_check_model``; everything else a client got wrong is 400.
"""

from __future__ import annotations

import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from enginesim.engine import prompt_token_estimate

# Chat templates add a few tokens per message (role markers, separators).
CHAT_TOKENS_PER_MESSAGE = 4
WORDS = ("the", "engine", "token", "stream", "batch", "cache", "model", "signal", "latency", "fleet",
         "replica", "queue", "block", "prefill", "decode", "sample", "request", "server", "health", "metric")


class ApiError(Exception):
    """An error answer: HTTP status plus vLLM's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @property
    def type(self) -> str:
        return {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(
            self.status, "InternalServerError")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


@dataclass(frozen=True)
class GenerationRequest:
    """A validated completion or chat request, reduced to what the engine needs."""

    chat: bool
    model: str
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    # (hash of the prompt up to a boundary, tokens up to it), shortest first: message boundaries for chat,
    # the whole prompt for completions. The prefix cache matches the longest one it has seen.
    prefixes: tuple[tuple[int, int], ...]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": "..."}]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _check_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ApiError(400, f"{key} must be a positive integer, got {value!r}", param=key)
    return value


def parse_request(body: Any, *, chat: bool, served_names: list[str], max_model_len: int) -> GenerationRequest:
    """Validate a /v1/completions or /v1/chat/completions body against the served model and its length."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model") or served_names[0]
    if model not in served_names:
        raise ApiError(404, f"The model `{model}` does not exist.", param="model")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages: field required, a non-empty list of messages", param="messages")
        if not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ApiError(400, "messages: each message needs a role", param="messages")
        prefixes: list[tuple[int, int]] = []
        crc = prompt_tokens = 0
        for m in messages:
            content = _text_of(m.get("content"))
            crc = zlib.crc32(f"{m['role']}: {content}\n".encode(), crc)
            prompt_tokens += prompt_token_estimate(content) + CHAT_TOKENS_PER_MESSAGE
            prefixes.append((crc, prompt_tokens))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise ApiError(400, "prompt: field required, a non-empty string", param="prompt")
        prompt_tokens = prompt_token_estimate(prompt)
        prefixes = [(zlib.crc32(prompt.encode()), prompt_tokens)]
    if prompt_tokens > max_model_len:
        raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, your "
                            f"request has {prompt_tokens} input tokens. Please reduce the length of the input "
                            "messages.", param="messages" if chat else "prompt")
    max_tokens = _check_int(body, "max_completion_tokens") if chat else None
    max_tokens = max_tokens or _check_int(body, "max_tokens") or max_model_len - prompt_tokens
    if prompt_tokens + max_tokens > max_model_len:
        raise ApiError(400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                            f"maximum context length is {max_model_len} tokens and your request has "
                            f"{prompt_tokens} input tokens ({max_tokens} > {max_model_len} - {prompt_tokens}).",
                       param="max_tokens")
    if max_tokens < 1:
        raise ApiError(400, "the prompt leaves no room for output tokens", param="max_tokens")
    stream_options = body.get("stream_options") or {}
    return GenerationRequest(
        chat=chat, model=model, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)), stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(stream_options, dict) and stream_options.get("include_usage")),
        prefixes=tuple(prefixes),
    )


def token_text(index: int) -> str:
    """The text of output token ``index``: deterministic words, one token each."""
    return " " + WORDS[(index * 7 + 3) % len(WORDS)]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens, "prompt_tokens_details": None}


@dataclass
class ResponseWriter:
    """Builds the chunks and bodies of one response, keeping its id and creation time."""

    req: GenerationRequest
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        prefix = "chatcmpl-" if self.req.chat else "cmpl-"
        self.id = self.id or prefix + uuid.uuid4().hex
        self.created = self.created or int(time.time())

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.req.model,
                "choices": choices}

    def role_chunk(self) -> dict[str, Any]:
        """vLLM's first chat chunk: the assistant role with empty content."""
        return self._envelope("chat.completion.chunk", [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])

    def token_chunk(self, index: int, finish_reason: str | None) -> dict[str, Any]:
        text = token_text(index)
        if self.req.chat:
            return self._envelope("chat.completion.chunk", [
                {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason,
                 "stop_reason": None}])
        return self._envelope("text_completion", [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}])

    def finish_chunk(self, finish_reason: str) -> dict[str, Any]:
        """Closes the choice when the last token chunk was already written."""
        if self.req.chat:
            return self._envelope("chat.completion.chunk", [
                {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": finish_reason,
                 "stop_reason": None}])
        return self._envelope("text_completion", [
            {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}])

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.req.chat else "text_completion"
        body = self._envelope(obj, [])
        body["usage"] = usage(self.req.prompt_tokens, completion_tokens)
        return body

    def full_response(self, completion_tokens: int, finish_reason: str) -> dict[str, Any]:
        text = "".join(token_text(i) for i in range(completion_tokens))
        if self.req.chat:
            choice: dict[str, Any] = {
                "index": 0, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None,
                "message": {"role": "assistant", "content": text, "refusal": None, "tool_calls": [],
                            "reasoning_content": None}}
            body = self._envelope("chat.completion", [choice])
        else:
            body = self._envelope("text_completion", [
                {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                 "stop_reason": None, "prompt_logprobs": None}])
        body["usage"] = usage(self.req.prompt_tokens, completion_tokens)
        body["prompt_logprobs"] = None
        return body
