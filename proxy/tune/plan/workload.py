"""What tune replays: the built-in workload or a trace file (``proxy.workloads.trace``).

The built-in workload covers what the published runs measured: a greeting, "write a simple
game in Python", and code and prose at growing context lengths (one per context bucket of the
router, up to the model's context), generated locally and deterministically. Prompts are sized in
the backend's own tokens (``proxy.tune.plan.context``: its context per slot and its tokenizer's
characters per token); a class whose prompt cannot fit that context is left out, and says why.

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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from proxy.apis import API_OF_PATH
from proxy.config.routing import RoutingSettings
from proxy.routing.classes import bucket_labels, classify_tokens
from proxy.routing.features import ContentKind, extract_features
from proxy.tune.plan.context import ServerContext
from proxy.tune.report.labels import class_order
from proxy.workloads import texts
from proxy.workloads.trace import TraceError, read_trace

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
class LeftOut:
    """A request of the workload that cannot fit the server's context, and why."""

    label: str  # the request class it would have measured
    item: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"class": self.label, "item": self.item, "reason": self.reason}


@dataclass(frozen=True)
class Workload:
    name: str
    items: tuple[WorkItem, ...]
    classes: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Item id -> the request class it is planned to measure (the analysis classifies again,
    from what the answers report)."""
    left_out: tuple[LeftOut, ...] = ()

    def planned_classes(self) -> list[str]:
        return sorted(set(self.classes.values()), key=class_order)

    def left_out_classes(self) -> dict[str, str]:
        """Classes none of whose requests fit -> the reason (one of its requests')."""
        planned = set(self.classes.values())
        out: dict[str, str] = {}
        for left in self.left_out:
            if left.label not in planned:
                out.setdefault(left.label, left.reason)
        return out

    def fingerprint(self) -> str:
        """Identifies the workload in saved results: a rerun on another one starts afresh."""
        h = hashlib.blake2b(digest_size=8)
        for item in self.items:
            h.update(item.id.encode() + b"\0" + item.path.encode() + b"\0")
            h.update(json.dumps(item.body, sort_keys=True).encode())
        return h.hexdigest()


_OUTPUTS: dict[ContentKind, int] = {"code": 512, "prose": 256}


def builtin_workload(
    n_ctx: int, buckets: list[int], model: str, *, server: ServerContext | None = None
) -> Workload:
    """Greeting, a game in Python, then code and prose per context bucket up to ``n_ctx`` (the
    configured context). With the ``server``'s own context, a prompt is clipped to what one slot
    holds, and left out (with the reason) when that no longer reaches its bucket."""
    items = [
        _chat("greeting", model, "Hi! How are you today?", 128),
        _chat("python-game", model, "Write a simple game in Python.", 512),
    ]
    left: list[LeftOut] = []
    rng = random.Random(_SEED)
    labels = bucket_labels(buckets)
    ratios = {**_CHARS_PER_TOKEN, **(server.chars_per_token if server else {})}
    for planned in context_targets(n_ctx, buckets, 512):
        bucket = labels[sum(1 for b in buckets if b <= planned)]
        for kind in ("code", "prose"):
            lo = max([0, *(b for b in buckets if b <= planned)])
            tokens = planned
            if server is not None:
                tokens = min(planned, server.n_ctx - _OUTPUTS[kind] - _HEADROOM)
            if tokens <= lo * 1.02 or tokens <= 0:
                assert server is not None  # the planned targets fit the configured context
                reason = (
                    f"needs over {max(lo, 1):,} prompt tokens + {_OUTPUTS[kind]} out; the "
                    f"server's context is {server.n_ctx:,} tokens per slot"
                )
                left.append(LeftOut(f"{bucket}/{kind}", f"{kind}-{planned}", reason))
                continue
            items.append(_sized(kind, tokens, ratios[kind], rng, model))
    return Workload("builtin", tuple(items), left_out=tuple(left))


def _sized(
    kind: str, tokens: int, chars_per_token: float, rng: random.Random, model: str
) -> WorkItem:
    chars = int(tokens * chars_per_token)
    if kind == "code":
        code = texts.code_file(rng, chars)
        ask = "Review this module: explain what it does and fix the bug in it."
        return _chat(f"code-{tokens}", model, f"```python\n{code}```\n\n{ask}", _OUTPUTS["code"])
    report = texts.prose(rng, chars)
    ask = "Summarize the main points of this report in a few paragraphs."
    return _chat(f"prose-{tokens}", model, f"Report\n\n{report}\n\n{ask}", _OUTPUTS["prose"])


@dataclass(frozen=True)
class Size:
    """A request in the server's tokens (estimated from its characters per token)."""

    kind: ContentKind
    prompt_tokens: int
    output_tokens: int


def size_of(item: WorkItem, chars_per_token: Mapping[str, float]) -> Size:
    """The router's features of the request as sent, with the tokenizer's ratio of its kind."""
    body = item.request("tune 0.0")
    api = API_OF_PATH[item.path]
    kind = extract_features(
        api, body, chars_per_token=1.0, session_header=None, pin_header=None
    ).kind  # the content kind does not depend on the ratio; the token estimate does
    ratio = {**_CHARS_PER_TOKEN, **chars_per_token}[kind]
    f = extract_features(api, body, chars_per_token=ratio, session_header=None, pin_header=None)
    return Size(kind, f.est_prompt_tokens, f.max_tokens or OUTPUT_CAP)


def fit_workload(
    workload: Workload, routing: RoutingSettings, server: ServerContext | None
) -> Workload:
    """Each request's planned class, in the server's tokens where known; a request whose prompt
    and output cannot fit one slot's context is left out, with the reason."""
    ratios = server.chars_per_token if server else {}
    kept: list[WorkItem] = []
    classes: dict[str, str] = {}
    left = list(workload.left_out)
    for item in workload.items:
        size = size_of(item, ratios)
        label = classify_tokens(size.prompt_tokens, size.kind, routing).label
        if server is not None and size.prompt_tokens + size.output_tokens > server.n_ctx:
            reason = (
                f"needs ~{size.prompt_tokens:,} prompt tokens + {size.output_tokens} out; the "
                f"server's context is {server.n_ctx:,} tokens per slot"
            )
            left.append(LeftOut(label, item.id, reason))
            continue
        kept.append(item)
        classes[item.id] = label
    return replace(workload, items=tuple(kept), classes=classes, left_out=tuple(left))


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
    """A trace file (``proxy.workloads.trace``); every request's model is set to ``model``."""
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
