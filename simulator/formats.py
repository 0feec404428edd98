"""Response shapes of each API, as llama-server emits them (field order included).

Streams are built from bytes prepared once per request: a token chunk is prefix + the token's
pre-encoded JSON string + suffix. Timings appear exactly where llama-server puts them:
chat/completions on the final chunk (or on the extra usage chunk with include_usage, or on every
chunk with timings_per_token), responses only on the streamed `response.completed` event,
Anthropic messages never.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from simulator.engine import Job
from simulator.structured import token_logprobs

BUILD_INFO = "b11434-mtp-simulator"
DONE = b"data: [DONE]\n\n"


class Api(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"
    RESPONSES = "responses"
    MESSAGES = "messages"
    NATIVE = "native"  # llama-server's own /completion


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _data(value: Any) -> bytes:
    return f"data: {_dumps(value)}\n\n".encode()


def _event(name: str, value: Any) -> bytes:
    return f"event: {name}\ndata: {_dumps(value)}\n\n".encode()


def _usage(job: Job) -> dict[str, Any]:
    t = job.timings
    prompt = len(job.tokens)
    return {
        "completion_tokens": t.predicted_n,
        "prompt_tokens": prompt,
        "total_tokens": prompt + t.predicted_n,
        "prompt_tokens_details": {"cached_tokens": t.cache_n},
    }


def _resp_usage(job: Job) -> dict[str, Any]:
    t = job.timings
    prompt = len(job.tokens)
    return {
        "input_tokens": prompt,
        "output_tokens": t.predicted_n,
        "total_tokens": prompt + t.predicted_n,
        "input_tokens_details": {"cached_tokens": t.cache_n},
    }


def _anthropic_usage(job: Job, output_tokens: int) -> dict[str, Any]:
    t = job.timings
    return {
        "cache_read_input_tokens": t.cache_n,
        "input_tokens": len(job.tokens) - t.cache_n,
        "output_tokens": output_tokens,
    }


def _stop_reason(job: Job) -> str:
    return "end_turn" if job.finish_reason == "stop" else "max_tokens"


class Response:
    """One request's identity plus its encoders (stream chunks and non-stream body).
    ``logprobs``: top tokens listed per generated token (0: none); ``tool``: the answer is a
    call of this function, its text the arguments (simulator.structured)."""

    def __init__(
        self,
        api: Api,
        model: str,
        job: Job,
        body: dict[str, Any],
        *,
        logprobs: int = 0,
        tool: str | None = None,
    ) -> None:
        self.api = api
        self.model = model
        self.job = job
        self.created = int(time.time())
        self.id = ("resp_" if api is Api.RESPONSES else "chatcmpl-") + secrets.token_hex(16)
        self.message_id = "msg_" + secrets.token_hex(16)
        options = body.get("stream_options")
        self.include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        self.per_token_timings = bool(body.get("timings_per_token"))
        self.logprobs, self.tool = logprobs, tool
        self.tool_call_id = secrets.token_urlsafe(24)[:32]  # llama-server's: 32 characters
        self.started = False
        self._prefix, self._suffix = self._token_frame()

    # --- stream ---------------------------------------------------------------------------------

    def _tail(self, obj: str) -> str:
        return (
            f',"created":{self.created},"id":"{self.id}","model":{_dumps(self.model)},'
            f'"system_fingerprint":"{BUILD_INFO}","object":"{obj}"'
        )

    def _token_frame(self) -> tuple[bytes, bytes]:
        if self.api is Api.CHAT:
            head = 'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":'
            return head.encode(), ("}}]" + self._tail("chat.completion.chunk")).encode()
        if self.api is Api.COMPLETION:
            return b'data: {"choices":[{"text":', (
                ',"index":0,"logprobs":null,"finish_reason":null}]'
                f',"created":{self.created},"model":{_dumps(self.model)},'
                f'"system_fingerprint":"{BUILD_INFO}","object":"text_completion","id":"{self.id}"'
            ).encode()
        if self.api is Api.NATIVE:
            n_prompt = len(self.job.tokens)
            tail = f',"tokens":[],"stop":false,"id_slot":-1,"tokens_evaluated":{n_prompt}'
            return b'data: {"index":0,"content":', tail.encode()
        if self.api is Api.RESPONSES:
            head = 'event: response.output_text.delta\ndata: {"type":"response.output_text.delta"'
            return f'{head},"item_id":"{self.message_id}","delta":'.encode(), b""
        head = 'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        return (head + '"delta":{"type":"text_delta","text":').encode(), b"}"

    def _preamble(self) -> bytes:
        """What a stream sends before its first token, as llama-server does for each API."""
        if self.api is Api.CHAT:
            return self._chat_preamble()
        if self.api is Api.RESPONSES:
            return self._responses_preamble()
        if self.api is Api.MESSAGES:
            return self._messages_preamble()
        return b""

    def _chat_preamble(self) -> bytes:
        return _data(
            {
                "choices": [
                    {
                        "finish_reason": None,
                        "index": 0,
                        "delta": {"role": "assistant", "content": None},
                    }
                ],
                "created": self.created,
                "id": self.id,
                "model": self.model,
                "system_fingerprint": BUILD_INFO,
                "object": "chat.completion.chunk",
            }
        )

    def _responses_preamble(self) -> bytes:
        stub = {"id": self.id, "object": "response", "status": "in_progress"}
        item = {
            "content": [],
            "id": self.message_id,
            "role": "assistant",
            "status": "in_progress",
            "type": "message",
        }
        part = {
            "type": "response.content_part.added",
            "item_id": self.message_id,
            "part": {"type": "output_text", "text": ""},
        }
        return b"".join(
            (
                _event("response.created", {"type": "response.created", "response": stub}),
                _event("response.in_progress", {"type": "response.in_progress", "response": stub}),
                _event(
                    "response.output_item.added",
                    {"type": "response.output_item.added", "item": item},
                ),
                _event("response.content_part.added", part),
            )
        )

    def _messages_preamble(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _anthropic_usage(self.job, 0),
        }
        block = {"type": "content_block_start", "index": 0}
        block["content_block"] = {"type": "text", "text": ""}
        return _event("message_start", {"type": "message_start", "message": message}) + _event(
            "content_block_start", block
        )

    def tokens(self, quoted: Sequence[bytes], first: int = 0) -> bytes:
        """Stream bytes for tokens produced by one step (one chunk/event per token); ``first``:
        the answer's position of the first."""
        out = [] if self.started else [self._preamble()]
        self.started = True
        if (self.logprobs or self.tool) and self.api in (Api.CHAT, Api.COMPLETION):
            out.extend(_data(chunk) for chunk in self._rich_chunks(first, len(quoted)))
            return b"".join(out)
        if self.per_token_timings and self.api in (Api.CHAT, Api.COMPLETION):
            timings = f',"timings":{_dumps(self.job.timings.to_json())}'.encode()
            end = self._suffix + timings + b"}\n\n"
        else:
            end = self._suffix + b"}\n\n"
        out.extend(self._prefix + q + end for q in quoted)
        return b"".join(out)

    def _rich_chunks(self, first: int, count: int) -> list[dict[str, Any]]:
        """Token chunks that carry more than the token: its logprobs, or a tool call's
        arguments (llama-server's deltas: the call's id, type and name with the first)."""
        texts, ids = self._answer(first, count)
        entries = self._logprobs(texts, ids) if self.logprobs else [None] * count
        chunks = []
        for n, (text, entry) in enumerate(zip(texts, entries, strict=True)):
            if self.api is Api.COMPLETION:
                choice: dict[str, Any] = {"text": text, "index": 0}
                choice |= {"logprobs": entry and {"content": [entry]}, "finish_reason": None}
                head = self._ids("text_completion")
                last = head.pop("id")  # llama-server's order: the id last
                chunks.append({"choices": [choice], **head, "id": last})
                continue
            delta: dict[str, Any] = {"content": text}
            if self.tool:
                call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
                if first + n == 0:
                    call |= {"id": self.tool_call_id, "type": "function"}
                    call["function"] = {"name": self.tool, "arguments": text}
                delta = {"tool_calls": [call]}
            choice = {"finish_reason": None, "index": 0, "delta": delta}
            if entry is not None:
                choice["logprobs"] = {"content": [entry]}
            chunks.append({"choices": [choice], **self._ids("chat.completion.chunk")})
        return chunks

    def _ids(self, obj: str) -> dict[str, Any]:
        return {
            "created": self.created,
            "id": self.id,
            "model": self.model,
            "system_fingerprint": BUILD_INFO,
            "object": obj,
        }

    def _answer(self, first: int, count: int) -> tuple[list[str], list[int]]:
        """The texts and ids of the answer's tokens ``first`` .. ``first + count``."""
        passage, start = self.job.passage, self.job.start + first
        n = len(passage.texts)
        texts = [passage.texts[(start + i) % n] for i in range(count)]
        return texts, [passage.ids[(start + i) % n] for i in range(count)]

    def _logprobs(self, texts: list[str], ids: list[int]) -> list[dict[str, Any]]:
        passage = self.job.passage
        alternatives = list(dict(zip(passage.ids, passage.texts, strict=True)).items())[:64]
        return token_logprobs(texts, ids, alternatives, self.logprobs)

    def finish(self, text: str) -> bytes:
        """Closing chunks/events of a stream, timings where llama-server puts them."""
        out = b"" if self.started else self._preamble()
        self.started = True
        job, timings = self.job, self.job.timings.to_json()
        if self.api is Api.CHAT:
            final: dict[str, Any] = {
                "choices": [{"finish_reason": self._finish_reason(), "index": 0, "delta": {}}],
                "created": self.created,
                "id": self.id,
                "model": self.model,
                "system_fingerprint": BUILD_INFO,
                "object": "chat.completion.chunk",
            }
            if not self.include_usage:
                return out + _data({**final, "timings": timings}) + DONE
            usage = {**final, "choices": [], "usage": _usage(job), "timings": timings}
            return out + _data(final) + _data(usage) + DONE
        if self.api is Api.COMPLETION:
            return out + _data({**self._completion(""), "timings": timings}) + DONE
        if self.api is Api.NATIVE:  # no [DONE] on llama-server's own stream
            return out + _data(self._native(""))
        if self.api is Api.RESPONSES:
            return out + self._responses_end(text, timings)
        return out + self._messages_end()

    def _responses_end(self, text: str, timings: dict[str, Any]) -> bytes:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
        item = {
            "type": "message",
            "status": "completed",
            "id": self.message_id,
            "content": [part],
            "role": "assistant",
        }
        done = {
            "type": "response.completed",
            "response": {
                "id": self.id,
                "object": "response",
                "created_at": self.created,
                "status": "completed",
                "model": self.model,
                "output": [item],
                "usage": _resp_usage(self.job),
            },
            "timings": timings,
        }
        return b"".join(
            (
                _event(
                    "response.output_text.done",
                    {"type": "response.output_text.done", "item_id": self.message_id, "text": text},
                ),
                _event(
                    "response.content_part.done",
                    {
                        "type": "response.content_part.done",
                        "item_id": self.message_id,
                        "part": part,
                    },
                ),
                _event(
                    "response.output_item.done", {"type": "response.output_item.done", "item": item}
                ),
                _event("response.completed", done),
            )
        )

    def _messages_end(self) -> bytes:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(self.job), "stop_sequence": None},
            "usage": {"output_tokens": self.job.timings.predicted_n},
        }
        return b"".join(
            (
                _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
                _event("message_delta", delta),
                _event("message_stop", {"type": "message_stop"}),
            )
        )

    # --- non-stream -----------------------------------------------------------------------------

    def _completion(self, text: str) -> dict[str, Any]:
        return {
            "choices": [
                {
                    "text": text,
                    "index": 0,
                    "logprobs": None,
                    "finish_reason": self.job.finish_reason,
                }
            ],
            "created": self.created,
            "model": self.model,
            "system_fingerprint": BUILD_INFO,
            "object": "text_completion",
            "usage": _usage(self.job),
            "id": self.id,
        }

    def _native(self, text: str) -> dict[str, Any]:
        """llama-server's /completion result (without generation_settings and the prompt)."""
        t, prompt = self.job.timings, len(self.job.tokens)
        return {
            "index": 0,
            "content": text,
            "tokens": [],
            "id_slot": 0,
            "stop": True,
            "model": self.model,
            "tokens_predicted": t.predicted_n,
            "tokens_evaluated": prompt,
            "has_new_line": "\n" in text,
            "truncated": False,
            "stop_type": "eos" if self.job.finish_reason == "stop" else "limit",
            "stopping_word": "",
            "tokens_cached": prompt + t.predicted_n,
            "timings": t.to_json(),
        }

    def _finish_reason(self) -> str:
        stopped = self.job.finish_reason == "stop"
        return "tool_calls" if stopped and self.tool else self.job.finish_reason

    def _chat_choice(self, text: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.tool:  # llama-server's message of a call: empty content, the call, its id
            function = {"name": self.tool, "arguments": text}
            call = {"type": "function", "function": function, "id": self.tool_call_id}
            message = {"role": "assistant", "content": "", "tool_calls": [call]}
        choice = {"finish_reason": self._finish_reason(), "index": 0, "message": message}
        if self.logprobs:
            choice["logprobs"] = {"content": self._all_logprobs()}
        return choice

    def _all_logprobs(self) -> list[dict[str, Any]]:
        return self._logprobs(*self._answer(0, self.job.produced))

    def body(self, text: str) -> dict[str, Any]:
        job = self.job
        if self.api is Api.NATIVE:
            return self._native(text)
        if self.api is Api.COMPLETION:
            completion = {**self._completion(text), "timings": job.timings.to_json()}
            if self.logprobs:
                completion["choices"][0]["logprobs"] = {"content": self._all_logprobs()}
            return completion
        if self.api is Api.CHAT:
            return {
                "choices": [self._chat_choice(text)],
                "created": self.created,
                "model": self.model,
                "system_fingerprint": BUILD_INFO,
                "object": "chat.completion",
                "usage": _usage(job),
                "id": self.id,
                "timings": job.timings.to_json(),
            }
        if self.api is Api.RESPONSES:
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
            return {
                "completed_at": int(time.time()),
                "created_at": self.created,
                "id": self.id,
                "model": self.model,
                "object": "response",
                "output": [
                    {
                        "content": [part],
                        "id": self.message_id,
                        "role": "assistant",
                        "status": "completed",
                        "type": "message",
                    }
                ],
                "status": "completed",
                "usage": _resp_usage(job),
            }
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "model": self.model,
            "stop_reason": _stop_reason(job),
            "stop_sequence": None,
            "usage": _anthropic_usage(job, job.timings.predicted_n),
        }
