"""What tune replays: the built-in workload or a trace file (``proxy.tune.trace``).

The built-in workload covers what the published runs measured: a greeting, "write a simple
game in Python", and code and prose at growing context lengths (one per context bucket of the
router, up to the model's context), generated locally and deterministically.

Every request is sent with a short marker line at the start of its prompt (``tag``): the same
prompt under two settings would otherwise be answered from the prefix cache, and the prefill
time would measure the cache, not the setting.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.routing.classes import bucket_labels
from proxy.tune import texts
from proxy.tune.trace import TraceError, read_trace

CHAT = "/v1/chat/completions"
OUTPUT_CAP = 512
"""Output tokens per request at most: a file's requests may allow 8k; tuning needs a few
hundred tokens per request to measure the decode speed, not the whole answer."""
_CHARS_PER_TOKEN = {"code": 3.3, "prose": 3.9}  # rough, only to size generated text
_HEADROOM = 1024  # tokens left free of the context besides the output (template, marker)
_SEED = 14
_MAX_TOKEN_KEYS = {
    CHAT: ("max_completion_tokens", "max_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
    "/v1/messages": ("max_tokens",),
}


class WorkloadError(ValueError):
    """The workload file cannot be used; the message says why."""


@dataclass(frozen=True)
class WorkItem:
    """One request of the workload, as a client would send it."""

    id: str
    path: str
    body: dict[str, Any]

    def request(self, tag: str) -> dict[str, Any]:
        """The body to send: the marker line in front of the prompt, output capped, streamed."""
        body = copy.deepcopy(self.body)
        _prepend(self.path, body, f"[{tag}]\n")
        _cap_output(self.path, body)
        body["stream"] = True
        return body


@dataclass(frozen=True)
class Workload:
    name: str
    items: tuple[WorkItem, ...]

    def fingerprint(self) -> str:
        """Identifies the workload in saved results: a rerun on another one starts afresh."""
        h = hashlib.blake2b(digest_size=8)
        for item in self.items:
            h.update(item.id.encode() + b"\0" + item.path.encode() + b"\0")
            h.update(json.dumps(item.body, sort_keys=True).encode())
        return h.hexdigest()


def builtin_workload(n_ctx: int, buckets: list[int], model: str) -> Workload:
    """Greeting, a game in Python, then code and prose per context bucket up to ``n_ctx``."""
    items = [
        _chat("greeting", model, "Hi! How are you today?", 128),
        _chat("python-game", model, "Write a simple game in Python.", 512),
    ]
    rng = random.Random(_SEED)
    for tokens in context_targets(n_ctx, buckets, 512):
        code = texts.code_file(rng, int(tokens * _CHARS_PER_TOKEN["code"]))
        ask = "Review this module: explain what it does and fix the bug in it."
        items.append(_chat(f"code-{tokens}", model, f"```python\n{code}```\n\n{ask}", 512))
        report = texts.prose(rng, int(tokens * _CHARS_PER_TOKEN["prose"]))
        ask = "Summarize the main points of this report in a few paragraphs."
        items.append(_chat(f"prose-{tokens}", model, f"Report\n\n{report}\n\n{ask}", 256))
    return Workload("builtin", tuple(items))


def context_targets(n_ctx: int, buckets: list[int], output: int) -> list[int]:
    """One prompt length per context bucket that fits the context: the geometric middle of
    the bucket (the top one: 1.25x its lower bound); buckets that cannot fit are left out."""
    room = n_ctx - output - _HEADROOM
    bounds = [0, *buckets, math.inf]
    targets = []
    for lo, hi in itertools.pairwise(bounds):
        if lo == 0:
            target = hi / 2
        elif hi == math.inf:
            target = lo * 1.25
        else:
            target = math.sqrt(lo * hi)
        target = min(target, room)
        if target > lo * 1.02:  # clipped to the context but still inside the bucket
            targets.append(int(target))
    assert len(targets) <= len(bucket_labels(buckets))
    return targets


def file_workload(path: Path, model: str) -> Workload:
    """A trace file (``proxy.tune.trace``); every request's model is set to ``model``."""
    try:
        trace = read_trace(path)
    except OSError as exc:
        raise WorkloadError(f"cannot read {path}: {exc}") from None
    except TraceError as exc:
        raise WorkloadError(f"{path}: {exc}") from None
    if not trace:
        raise WorkloadError(f"{path}: no requests")
    items = tuple(WorkItem(f"{r.index}", r.path, {**r.body, "model": model}) for r in trace)
    return Workload(path.name, items)


def _chat(item_id: str, model: str, text: str, max_tokens: int) -> WorkItem:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        # A fixed answer length: every setting decodes the same number of tokens.
        "ignore_eos": True,
    }
    return WorkItem(item_id, CHAT, body)


def _prepend(path: str, body: dict[str, Any], text: str) -> None:
    """Put ``text`` in front of the first text of the prompt, whatever the API's shape."""
    if path == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            body["prompt"] = text + prompt
        elif isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            body["prompt"] = [text + prompt[0], *prompt[1:]]
        return
    if path == "/v1/messages" and body.get("system") is not None:
        body["system"] = _prepend_content(body["system"], text)
        return
    if path == "/v1/responses":
        if isinstance(body.get("instructions"), str):
            body["instructions"] = text + body["instructions"]
        elif isinstance(body.get("input"), str):
            body["input"] = text + body["input"]
        elif isinstance(body.get("input"), list):
            _prepend_first_message(body["input"], text)
        return
    messages = body.get("messages")
    if isinstance(messages, list):
        _prepend_first_message(messages, text)


def _prepend_first_message(messages: list[Any], text: str) -> None:
    for message in messages:
        if isinstance(message, dict) and "content" in message:
            message["content"] = _prepend_content(message["content"], text)
            return


def _prepend_content(content: Any, text: str) -> Any:
    if isinstance(content, str):
        return text + content
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                part["text"] = text + part["text"]
                return content
    return content


def _cap_output(path: str, body: dict[str, Any]) -> None:
    keys = _MAX_TOKEN_KEYS.get(path, ("max_tokens",))
    present = [k for k in keys if isinstance(body.get(k), int) and not isinstance(body[k], bool)]
    if not present:
        body[keys[0]] = OUTPUT_CAP
    for key in present:
        body[key] = min(body[key], OUTPUT_CAP)
