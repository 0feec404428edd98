"""Request features: what the routing policy knows about a request before forwarding it.

Pure and fast: one walk over the parsed body that only sums string lengths and keeps references
to the strings, then cheap ``str.count`` signals over a bounded sample (never the whole prompt).

Malformed shapes are tolerated on purpose: features are computed from whatever is there and the
backend judges validity (it answers 400 in its own words). Only a body that is not a JSON object
raises ``FeatureError`` (a ValueError), which the app maps to 400.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.apis import Api
from proxy.routing.logprobs import asks_logprobs

ContentKind = Literal["code", "prose"]

IMAGE_TOKENS = 768
"""Rough prompt cost of one image or other media part (its bytes are no text)."""
TEMPLATE_TOKENS_PER_MESSAGE = 5
"""Chat-template tokens around each message (role markers of ChatML, Llama 3 and the like)."""

_MAX_DEPTH = 24  # generic walks of tool arguments / schemas stop here (hostile nesting)
_SAMPLE_SEGMENT = 2000  # chars taken from the head of one text segment for the sample
_SAMPLE_BUDGET = 6000  # chars of recent text sampled for the code/prose signals
_SYSTEM_SAMPLE = 3000  # chars of the system prompt sampled for the agent signal
_HASH_HALF = 4096  # per segment, the session hash covers head + tail + length
_DENSITY_FLOOR = 200  # densities of tiny samples are computed over at least this many chars
_FENCED_BUDGET = 262_144  # chars of recent text whose fenced share is measured (whole, not heads)
_FENCED_BULK = 0.5  # a prompt this much inside fenced blocks is code, whatever leads it in

_MEDIA_TYPES = frozenset(
    {"image_url", "image", "input_image", "input_audio", "file", "input_file", "document"}
)
_TEXT_TYPES = frozenset({"text", "input_text", "output_text"})
_CALL_TYPES = frozenset({"tool_use", "function_call", "custom_tool_call", "server_tool_use"})
_RESULT_TYPES = frozenset(
    {"tool_result", "function_call_output", "custom_tool_call_output", "web_search_tool_result"}
)
_SYSTEM_ROLES = frozenset({"system", "developer"})

# Substrings that are frequent in source code and rare in prose; counted with str.count
# (each count is a C-speed scan of the sample, so the list stays short).
_CODE_TOKENS = (
    "def ",
    "return ",
    "import ",
    "function",
    "const ",
    "self.",
    "()",
    " = ",
    "#include",
    "null",
)
# Operator bigrams of code that JSON tool results and prose lack.
_CODE_SYMBOLS = (";", "){", "=>", "->", "==", "):")
# Words of a coding agent's system prompt; three different ones make it an agent prompt.
_AGENT_WORDS = (
    "tool",
    "file",
    "edit",
    "terminal",
    "shell",
    "command",
    "repositor",
    "codebase",
    "code",
    "diff",
    "git ",
)
_AGENT_MIN_WORDS = 3
_CODE_SCORE = 3
# A request for code in plain words ("write a Python function that ...") has no code in its
# prompt yet, but its answer is code, and the answer is what the drafter has to guess.
_CODE_REQUEST = re.compile(
    r"\b(?:write|implement|fix|refactor|debug|optimi[sz]e|port|rewrite)\b[^.?!\n]{0,80}?"
    r"\b(?:code|function|script|program|class|method|module|snippet|bug|tests?|query|regex"
    r"|python|javascript|typescript|rust|golang|java|sql|bash|shell|c\+\+|html|css|api)\b",
    re.IGNORECASE,
)
_REQUEST_CHARS = 600  # the head of the latest text segment that is searched for such a request


class FeatureError(ValueError):
    """The body cannot be a request of any API (not a JSON object)."""


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    api: Api
    model: str
    prompt_chars: int
    est_prompt_tokens: int
    kind: ContentKind
    max_tokens: int | None
    stream: bool
    session_key: str | None
    has_tools: bool
    pinned_profile: str | None
    agentic: bool = False
    """Looks like a coding agent (tools / tool traffic / agent system prompt, and code)."""
    code_score: int = 0
    """Sum of the code signals (kind is "code" from 3 on); logged for tuning."""
    images: int = 0
    token_ids: int = 0
    """Prompt tokens given as token ids (completions), counted exactly."""
    messages: int = 0
    """Messages (turns, items) of the conversation: each costs template tokens."""
    logprobs: bool = False
    """It asks for token probabilities (``proxy.routing.logprobs``)."""


@dataclass(slots=True)
class _Walk:
    """Accumulates text segments (references only) and counters during one walk."""

    chars: int = 0
    segments: list[str] = field(default_factory=list)
    system_end: int = 0  # segments[:system_end] are the system prompt
    prefix_end: int | None = None  # segments[:prefix_end] = system + first user turn
    tool_calls: int = 0
    tool_results: int = 0
    images: int = 0
    token_ids: int = 0
    turns: int = 0

    def text(self, s: str) -> None:
        if s:
            self.chars += len(s)
            self.segments.append(s)

    def content(self, value: object) -> None:
        """A message content: a string, one part, or a list of parts/blocks."""
        # Hot loop (hundreds of blocks in an agent prompt): plain text parts take a fast path.
        if type(value) is str:
            self.text(value)
        elif type(value) is list:
            segments = self.segments
            for part in value:
                if type(part) is dict:
                    if _str(part.get("type")) in _TEXT_TYPES:
                        text = part.get("text")
                        if type(text) is str and text:
                            self.chars += len(text)
                            segments.append(text)
                            continue
                    self.part(part)
                elif isinstance(part, str):
                    self.text(part)
                elif isinstance(part, dict):
                    self.part(part)
        elif isinstance(value, str):
            self.text(value)
        elif isinstance(value, list):
            self.content(list(value))
        elif isinstance(value, dict):
            self.part(value)

    def part(self, d: dict[str, Any]) -> None:
        """A content part (chat), input item (Responses) or content block (Anthropic)."""
        kind = _str(d.get("type"))
        if "role" in d and kind in (None, "message"):
            self.message(d)
        elif kind in _MEDIA_TYPES:
            self.images += 1
        elif kind in _CALL_TYPES:
            self.tool_calls += 1
            self._call_payload(d)
        elif kind in _RESULT_TYPES:
            self.tool_results += 1
            self.content(d.get("content"))
            self.content(d.get("output"))
        else:
            for key in ("text", "thinking", "refusal"):
                value = d.get(key)
                if isinstance(value, str):
                    self.text(value)
            summary = d.get("summary")  # Responses reasoning items
            if isinstance(summary, list):
                self.content(summary)

    def message(self, m: dict[str, Any]) -> None:
        if m.get("role") in ("tool", "function"):
            self.tool_results += 1
        self.content(m.get("content"))
        if len(m) > 2:  # more than role + content
            self._extras(m)

    def _extras(self, m: dict[str, Any]) -> None:
        """Reasoning text and tool calls of an (assistant) message."""
        reasoning = m.get("reasoning_content")
        if isinstance(reasoning, str):
            self.text(reasoning)
        calls = m.get("tool_calls")
        if not isinstance(calls, list):
            return
        for call in calls:
            if not isinstance(call, dict):
                continue
            self.tool_calls += 1
            fn = call.get("function")
            if type(fn) is dict:  # the usual shape: {"function": {"name", "arguments": str}}
                name, args = fn.get("name"), fn.get("arguments")
                if type(name) is str and type(args) is str:
                    self.chars += len(name) + len(args)
                    self.segments.append(args)
                    continue
            self._call_payload(fn if isinstance(fn, dict) else call)

    def _call_payload(self, d: Mapping[str, Any]) -> None:
        name = d.get("name")
        if isinstance(name, str):
            self.chars += len(name)
        for key in ("arguments", "input"):
            value = d.get(key)
            if isinstance(value, str):
                self.text(value)
            elif value is not None:
                self.chars += _size_any(value, 0, self.segments)

    def messages(self, value: object, system_roles: frozenset[str]) -> None:
        """A conversation; leading system messages join the system prompt segments."""
        if not isinstance(value, list):
            return
        self.turns += len(value)
        segments = self.segments
        start = 0
        for m in value:  # leading system/developer messages form the system prompt
            if not (isinstance(m, dict) and _str(m.get("role")) in system_roles):
                break
            self.content(m.get("content"))
            self.system_end = len(segments)
            start += 1
        # Hot loop: an agent transcript has hundreds to thousands of messages, so the common
        # shapes are handled inline (one call per message at most).
        chars = 0
        for m in value[start:] if start else value:
            if not isinstance(m, dict):
                continue
            role = m.get("role")
            if role is None and m.get("type", "message") != "message":
                self.part(m)  # a Responses item: function_call, function_call_output, ...
                continue
            content = m.get("content")
            if type(content) is str:
                if content:
                    chars += len(content)
                    segments.append(content)
            elif content is not None:
                self.content(content)
            if role == "tool" or role == "function":  # noqa: PLR1714 - role may be unhashable
                self.tool_results += 1
            if len(m) > 2 and ("tool_calls" in m or "reasoning_content" in m):
                self._extras(m)
            if role == "user" and self.prefix_end is None:
                self.prefix_end = len(segments)
        self.chars += chars


def _str(value: object) -> str | None:
    """Strings only: hostile bodies put lists where names belong (unhashable in set tests)."""
    return value if type(value) is str else None


def _size_any(value: object, depth: int, segments: list[str]) -> int:
    """Characters of every string (keys included) in a JSON value; long strings are sampled."""
    if isinstance(value, str):
        if len(value) > 64:  # file contents and commands in tool arguments: worth sampling
            segments.append(value)
        return len(value)
    if depth >= _MAX_DEPTH:
        return 0
    if isinstance(value, dict):
        total = 0
        for k, v in value.items():
            total += len(k) + _size_any(v, depth + 1, segments)
        return total
    if isinstance(value, list):
        return sum([_size_any(v, depth + 1, segments) for v in value])
    return 4 if value is not None else 0


def _walk(api: Api, body: Mapping[str, Any]) -> _Walk:
    w = _Walk()
    if api == "chat":
        w.messages(body.get("messages"), _SYSTEM_ROLES)
    elif api == "messages":
        w.content(body.get("system"))
        w.system_end = len(w.segments)
        w.messages(body.get("messages"), frozenset())
    elif api == "responses":
        instructions = body.get("instructions")
        if isinstance(instructions, str):
            w.text(instructions)
        w.system_end = len(w.segments)
        inp = body.get("input")
        if isinstance(inp, str):
            w.text(inp)
            w.prefix_end = len(w.segments)
        else:
            w.messages(inp, _SYSTEM_ROLES)
    else:
        _walk_prompt(w, body.get("prompt"))
    return w


def _walk_prompt(w: _Walk, prompt: object) -> None:
    """Completions: a string, a list of strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        w.text(prompt)
    elif isinstance(prompt, list):
        for p in prompt:
            if isinstance(p, str):
                w.text(p)
            elif isinstance(p, int):
                w.token_ids += 1
            elif isinstance(p, list):
                w.token_ids += len(p)
    # The prompt head is the stable prefix llama-server's cache reuses.
    w.prefix_end = len(w.segments)


def _tools_chars(body: Mapping[str, Any]) -> tuple[bool, int]:
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        tools = body.get("functions")  # legacy chat
    if not isinstance(tools, list) or not tools:
        return False, 0
    return True, _size_any(tools, 0, [])


def _max_tokens(api: Api, body: Mapping[str, Any]) -> int | None:
    keys: tuple[str, ...]
    if api == "chat":
        keys = ("max_completion_tokens", "max_tokens", "n_predict")
    elif api == "responses":
        keys = ("max_output_tokens",)
    elif api == "completions":
        keys = ("max_tokens", "n_predict")
    else:
        keys = ("max_tokens",)
    for key in keys:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _sample(segments: Sequence[str], start: int) -> str:
    """Heads of the most recent segments (from index ``start`` on), up to the budget."""
    parts: list[str] = []
    budget = _SAMPLE_BUDGET
    for i in range(len(segments) - 1, start - 1, -1):
        s = segments[i]
        take = min(len(s), _SAMPLE_SEGMENT, budget)
        parts.append(s[:take])
        budget -= take
        if budget <= 0:
            break
    return "\n".join(parts)


def _system_sample(segments: Sequence[str], end: int) -> str:
    parts: list[str] = []
    budget = _SYSTEM_SAMPLE
    for s in segments[:end]:
        parts.append(s[:budget])
        budget -= len(parts[-1])
        if budget <= 0:
            break
    return "\n".join(parts)


def fenced_share(segments: Sequence[str], start: int) -> float:
    """The share of the recent text (from index ``start`` on, newest first, up to
    ``_FENCED_BUDGET`` chars) that lies inside fenced blocks (between a line's ``` and the
    next): a file given in the prompt to copy or refactor is code to the drafter, whatever
    English leads it in, though the heads of the segments sampled for the other signals may
    hold the lead-in alone."""
    inside = total = 0
    for i in range(len(segments) - 1, start - 1, -1):
        text = segments[i][: _FENCED_BUDGET - total]
        total += len(text)
        at = text.find("```")
        while at != -1:
            end = text.find("```", at + 3)
            if end == -1:
                inside += len(text) - at  # an open fence runs to the end of its segment
                break
            inside += end - at
            at = text.find("```", end + 3)
        if total >= _FENCED_BUDGET:
            break
    return inside / total if total else 0.0


def _code_score(w: _Walk, has_tools: bool) -> tuple[int, bool]:
    """Score the code signals; return (score, agent system prompt seen)."""
    sample = _sample(w.segments, w.system_end)
    n = max(len(sample), _DENSITY_FLOOR) / 1000.0
    score = 0
    if fenced_share(w.segments, w.system_end) >= _FENCED_BULK:
        score += _CODE_SCORE  # its bulk is a fenced block: code, whatever leads it in
    elif sample.count("```") >= 2:
        score += 3
    if "\n@@ " in sample or sample.count("\n+") >= 3:
        score += 2  # unified diffs / patches
    kw = sum(sample.count(t) for t in _CODE_TOKENS) / n
    score += 2 if kw >= 4.0 else 1 if kw >= 1.5 else 0
    sym = sum(sample.count(t) for t in _CODE_SYMBOLS) / n
    score += 2 if sym >= 6.0 else 1 if sym >= 2.0 else 0
    if (sample.count("\n    ") + sample.count("\n\t")) / n >= 5.0:
        score += 1
    if w.segments and _CODE_REQUEST.search(w.segments[-1][:_REQUEST_CHARS]):
        score += 3
    if w.tool_calls or w.tool_results:
        score += 1
    if has_tools:
        score += 1
    system = _system_sample(w.segments, w.system_end).lower()
    agent_system = sum(1 for word in _AGENT_WORDS if word in system) >= _AGENT_MIN_WORDS
    if agent_system:
        score += 3  # coding agents (Claude Code, Aider, ...) answer with code and tool calls
    return score, agent_system


def _session_key(w: _Walk, model: str) -> str | None:
    end = w.prefix_end
    if end is None or end == 0:
        return None
    h = hashlib.blake2b(model.encode("utf-8", "surrogatepass"), digest_size=8)
    for s in w.segments[:end]:
        n = len(s)
        # Bounded cost: head + tail + length identify a long segment well enough.
        piece = s if n <= 2 * _HASH_HALF else s[:_HASH_HALF] + s[-_HASH_HALF:]
        h.update(piece.encode("utf-8", "surrogatepass"))
        h.update(b"\x00%d\x00" % n)
    return h.hexdigest()


def _header(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return value[:256] or None


def extract_features(
    api: Api,
    body: Mapping[str, Any],
    *,
    chars_per_token: float,
    session_header: str | None,
    pin_header: str | None,
) -> RequestFeatures:
    """Features of one request body (already parsed JSON) of the given API.

    ``session_header`` / ``pin_header`` are the raw header values (or None).
    """
    if not isinstance(body, Mapping):
        raise FeatureError("request body must be a JSON object")
    w = _walk(api, body)
    has_tools, tool_chars = _tools_chars(body)
    score, agent_system = _code_score(w, has_tools)
    kind: ContentKind = "code" if score >= _CODE_SCORE else "prose"
    model = body.get("model")
    model = model if isinstance(model, str) else ""
    chars = w.chars + tool_chars
    # Each message also costs its chat template's tokens (role markers: 10,000 one-character
    # messages are ~60,000 tokens, not 10,000 / chars_per_token).
    est = int(chars / chars_per_token) + w.turns * TEMPLATE_TOKENS_PER_MESSAGE
    est += w.token_ids + w.images * IMAGE_TOKENS
    agent_signs = has_tools or w.tool_calls > 0 or w.tool_results > 0 or agent_system
    return RequestFeatures(
        api=api,
        model=model,
        prompt_chars=chars,
        est_prompt_tokens=est,
        kind=kind,
        max_tokens=_max_tokens(api, body),
        stream=body.get("stream") is True,
        session_key=_header(session_header) or _session_key(w, model),
        has_tools=has_tools,
        pinned_profile=_header(pin_header),
        agentic=agent_signs and kind == "code",
        code_score=score,
        images=w.images,
        token_ids=w.token_ids,
        messages=w.turns,
        logprobs=asks_logprobs(body),
    )
