"""Telemetry: what each response tells about the backend that served it.

llama-server reports ``timings`` (prompt_n, cache_n, predicted_n/ms, draft_n, draft_n_accepted)
on chat/completions bodies, on the final SSE chunk (or the include_usage chunk; every chunk with
timings_per_token) and on the streamed Responses ``response.completed`` event. Non-stream
Responses and Anthropic Messages carry only ``usage``; there the proxy's clock and the backend's
/metrics spec counters stand in.

Nothing here alters or delays the bytes: ``StreamTelemetry.feed`` looks at each forwarded chunk,
keeps a small tail and the raw bytes of the few events worth parsing, and parses them only once
the stream has ended.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson
from prometheus_client.parser import text_string_to_metric_families

from proxy.apis import Api
from proxy.routing.classes import RequestClass

Source = Literal["timings", "usage+clock"]

_MAX_TAIL = 16 * 1024 * 1024  # an "event" this large without a boundary is not SSE: give up
_SPEC_PREFIX = "llamacpp:spec_decode_num_"
_DECODE_CLOCK = ("llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total")


@dataclass(frozen=True, slots=True)
class ParsedUsage:
    """Token counts and timings read from one response. None = not reported."""

    has_timings: bool = False
    prompt_n: int | None = None  # timings: prompt tokens processed (not from cache)
    cache_n: int | None = None  # timings: prompt tokens reused from the slot cache
    predicted_n: int | None = None
    prompt_ms: float | None = None
    predicted_ms: float | None = None
    draft_n: int = 0  # absent in timings means nothing was drafted
    draft_n_accepted: int = 0
    input_tokens: int | None = None  # usage: whole prompt, cached part included
    cached_tokens: int | None = None
    output_tokens: int | None = None
    first_token_at: float | None = None  # proxy clock, streams only
    last_token_at: float | None = None
    events: int = 0  # SSE data events seen (streams)


@dataclass(frozen=True, slots=True)
class Observation:
    """One served request, as the learned statistics consume it."""

    backend: str
    profile: str
    request_class: RequestClass
    context_tokens: int | None
    cached_tokens: int | None
    output_tokens: int | None
    draft_n: int | None  # None: unknown (no timings and no exact /metrics delta)
    draft_n_accepted: int | None
    decode_tok_s: float | None
    prefill_s: float | None
    ttft_s: float | None
    total_s: float | None
    source: Source
    dropped: str | None = None
    """Why its numbers were not learned (``proxy.routing.plausibility``); None: learned."""

    @property
    def prefill_tokens(self) -> int | None:
        """Prompt tokens the backend actually processed (context minus cache hits)."""
        if self.context_tokens is None:
            return None
        return self.context_tokens - (self.cached_tokens or 0)

    @property
    def acceptance(self) -> float | None:
        if not self.draft_n or self.draft_n_accepted is None:
            return None
        return self.draft_n_accepted / self.draft_n


# --- field extraction -------------------------------------------------------------------------


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class _Fields:
    """Mutable merge target while reading one or several JSON objects."""

    __slots__ = ("cached", "draft_n", "draft_ok", "input", "output", "timings")

    def __init__(self) -> None:
        self.timings: dict[str, Any] | None = None
        self.input: int | None = None
        self.cached: int | None = None
        self.output: int | None = None
        self.draft_n = 0
        self.draft_ok = 0

    def read(self, api: Api, obj: object) -> None:
        if not isinstance(obj, dict):
            return
        timings = obj.get("timings")
        if isinstance(timings, dict):
            self.timings = timings
        for holder in (obj, obj.get("response"), obj.get("message")):
            if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
                self._usage(api, holder["usage"])

    def _usage(self, api: Api, usage: dict[str, Any]) -> None:
        if api == "messages":
            # Anthropic: input_tokens excludes cache reads (and cache writes).
            cached = _int(usage.get("cache_read_input_tokens"))
            if cached is not None:
                self.cached = cached
            fresh = _int(usage.get("input_tokens"))
            created = _int(usage.get("cache_creation_input_tokens")) or 0
            if fresh is not None:  # a later event may repeat input_tokens without cache reads
                self.input = fresh + (self.cached or 0) + created
        else:
            prompt = _int(usage.get("prompt_tokens"))
            self.input = prompt if prompt is not None else _int(usage.get("input_tokens"))
            details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
            if isinstance(details, dict):
                self.cached = _int(details.get("cached_tokens"))
        out = _int(usage.get("completion_tokens"))
        out = out if out is not None else _int(usage.get("output_tokens"))
        if out is not None:
            self.output = out

    def result(
        self, *, first: float | None = None, last: float | None = None, events: int = 0
    ) -> ParsedUsage:
        t = self.timings or {}
        return ParsedUsage(
            has_timings=self.timings is not None,
            prompt_n=_int(t.get("prompt_n")),
            cache_n=_int(t.get("cache_n")),
            predicted_n=_int(t.get("predicted_n")),
            prompt_ms=_float(t.get("prompt_ms")),
            predicted_ms=_float(t.get("predicted_ms")),
            draft_n=_int(t.get("draft_n")) or 0,
            draft_n_accepted=_int(t.get("draft_n_accepted")) or 0,
            input_tokens=self.input,
            cached_tokens=self.cached,
            output_tokens=self.output,
            first_token_at=first,
            last_token_at=last,
            events=events,
        )


def parse_body(api: Api, body: bytes) -> ParsedUsage:
    """Usage/timings of a non-stream response body; an unreadable body yields empty usage."""
    fields = _Fields()
    with contextlib.suppress(ValueError):  # orjson.JSONDecodeError is a ValueError
        fields.read(api, orjson.loads(body))
    return fields.result()


# --- streams --------------------------------------------------------------------------------


def _event_data(event: bytes) -> object:
    """The JSON payload of one SSE event (its data: lines joined), or None."""
    lines = [ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
    payload = b"\n".join(lines)
    if not payload or payload == b"[DONE]":
        return None
    try:
        return orjson.loads(payload)
    except ValueError:
        return None


class StreamTelemetry:
    """Reads telemetry off an SSE stream chunk by chunk, at a few byte searches per chunk."""

    __slots__ = (
        "_api",
        "_broken",
        "_cr",
        "_events",
        "_first",
        "_last",
        "_start",
        "_tail",
        "_timings",
        "_usage",
    )

    def __init__(self, api: Api) -> None:
        self._api: Api = api
        self._tail = bytearray()  # the incomplete last event; amortised appends
        self._cr = False  # a chunk ended in the middle of a CRLF
        self._events = 0
        self._broken = False
        self._timings: bytes | None = None  # last event carrying timings
        self._usage: bytes | None = None  # last event carrying usage (not message_start)
        self._start: bytes | None = None  # Anthropic message_start
        self._first: float | None = None
        self._last: float | None = None

    def feed(self, chunk: bytes, now: float | None = None) -> None:
        """Look at one forwarded chunk. ``now`` (optional) stamps first/last token times."""
        if now is not None:
            if self._first is None:
                self._first = now
            self._last = now
        if self._broken or not chunk:
            return
        if self._cr or b"\r" in chunk:
            chunk = self._crlf(chunk)
        tail = self._tail
        start = max(len(tail) - 1, 0)  # a blank line may straddle the previous chunk
        tail += chunk
        cut = tail.rfind(b"\n\n", start)
        if cut < 0:
            if len(tail) > _MAX_TAIL:  # not SSE after all: stop looking, keep memory bounded
                self._broken = True
                tail.clear()
            return
        done = bytes(tail[:cut])
        del tail[: cut + 2]
        self._scan(done)

    def _crlf(self, chunk: bytes) -> bytes:
        if self._cr:
            chunk = b"\r" + chunk
            self._cr = False
        if chunk.endswith(b"\r"):
            chunk = chunk[:-1]
            self._cr = True
        return chunk.replace(b"\r\n", b"\n")

    def _scan(self, done: bytes) -> None:
        self._events += done.count(b"data:")
        if b'"timings"' not in done and b'"usage"' not in done:
            return
        for event in done.split(b"\n\n"):
            if b'"timings"' in event:
                self._timings = event
            if b'"usage"' in event:
                if b"message_start" in event:
                    self._start = event
                else:
                    self._usage = event

    def mark_first_token(self, t: float) -> None:
        """Proxy-clock time the first token reached the client (earliest mark wins)."""
        if self._first is None or t < self._first:
            self._first = t

    def result(self, clock: float) -> ParsedUsage:
        """Parse what was kept; ``clock`` is when the stream ended (last token if unstamped)."""
        if self._tail.strip():  # a final event without its blank line (abrupt end)
            self._scan(bytes(self._tail))
            self._tail.clear()
        fields = _Fields()
        for raw in (self._start, self._usage, self._timings):
            if raw is not None:
                fields.read(self._api, _event_data(raw))
        last = self._last if self._last is not None else clock
        return fields.result(first=self._first, last=last, events=self._events)


# --- observations -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpecCounters:
    """llama-server's speculative-decoding counters from /metrics, and its decode clock
    (tokens_predicted_total, tokens_predicted_seconds_total) where it has one."""

    draft_tokens: float
    accepted_tokens: float
    drafts: float
    predicted_tokens: float | None = None
    predicted_seconds: float | None = None

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        return SpecCounters(
            self.draft_tokens - before.draft_tokens,
            self.accepted_tokens - before.accepted_tokens,
            self.drafts - before.drafts,
            _minus(self.predicted_tokens, before.predicted_tokens),
            _minus(self.predicted_seconds, before.predicted_seconds),
        )


def _minus(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def parse_spec_counters(text: str) -> SpecCounters | None:
    """The three spec counters of a /metrics page, or None if any is missing/unparsable."""
    values: dict[str, float] = {}
    clock: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels:
                    continue
                if sample.name.startswith(_SPEC_PREFIX):
                    values[sample.name[len(_SPEC_PREFIX) :]] = sample.value
                elif sample.name in _DECODE_CLOCK:
                    clock[sample.name] = sample.value
    except ValueError:
        return None
    try:
        return SpecCounters(
            draft_tokens=values["draft_tokens_total"],
            accepted_tokens=values["accepted_tokens_total"],
            drafts=values["drafts_total"],
            predicted_tokens=clock.get(_DECODE_CLOCK[0]),
            predicted_seconds=clock.get(_DECODE_CLOCK[1]),
        )
    except KeyError:
        return None


def _rate(tokens: int | None, seconds: float | None) -> float | None:
    if tokens is None or seconds is None or tokens <= 0 or seconds <= 0:
        return None
    return tokens / seconds


def make_observation(
    usage: ParsedUsage,
    *,
    backend: str,
    profile: str,
    request_class: RequestClass,
    sent_at: float,
    done_at: float,
    spec_delta: SpecCounters | None = None,
    clock_scale: float = 1.0,
) -> Observation:
    """Combine parsed usage with the proxy's clock (and, where the request ran alone on its
    backend, the /metrics counter delta) into one observation. ``clock_scale``: the proxy's
    clock runs that many times slower than the backend's (a time-compressed simulator,
    ``routing.clock_scale``): every span it measured is scaled to the backend's seconds."""
    first = usage.first_token_at
    ttft = (first - sent_at) * clock_scale if first is not None else None
    common = Observation(
        backend=backend,
        profile=profile,
        request_class=request_class,
        context_tokens=usage.input_tokens,
        cached_tokens=usage.cached_tokens,
        output_tokens=usage.output_tokens,
        draft_n=None,
        draft_n_accepted=None,
        decode_tok_s=None,
        prefill_s=ttft,  # includes the network hop and any queueing: an upper bound
        ttft_s=ttft,
        total_s=(done_at - sent_at) * clock_scale,
        source="usage+clock",
    )
    if usage.has_timings:
        return replace(
            common,
            context_tokens=(usage.prompt_n or 0) + (usage.cache_n or 0),
            cached_tokens=usage.cache_n,
            output_tokens=usage.predicted_n,
            draft_n=usage.draft_n,
            draft_n_accepted=usage.draft_n_accepted,
            decode_tok_s=_rate(usage.predicted_n, (usage.predicted_ms or 0.0) / 1000.0),
            prefill_s=usage.prompt_ms / 1000.0 if usage.prompt_ms is not None else None,
            source="timings",
        )
    return _with_counters(common, usage, spec_delta, clock_scale)


def _with_counters(
    observation: Observation,
    usage: ParsedUsage,
    spec_delta: SpecCounters | None,
    clock_scale: float,
) -> Observation:
    """An answer without timings: its decode speed from the proxy's clock, or from the
    backend's /metrics counters where they moved for this request alone, with its drafts."""
    first, last, out = usage.first_token_at, usage.last_token_at, usage.output_tokens
    decode = None
    if first is not None and last is not None and out is not None and out > 1:
        # The first token arrives with the prefill; the rest take (last - first).
        decode = _rate(out - 1, (last - first) * clock_scale)
    # A counter reset (backend restart) shows as a negative delta: unknown then.
    if spec_delta is None or min(spec_delta.draft_tokens, spec_delta.accepted_tokens) < 0:
        return replace(observation, decode_tok_s=decode)
    drafted, accepted = int(spec_delta.draft_tokens), int(spec_delta.accepted_tokens)
    # The backend's own decode clock, exact for a request that ran alone: the proxy's clock
    # adds the relay's and the network's jitter to every token's time.
    tokens, seconds = spec_delta.predicted_tokens, spec_delta.predicted_seconds
    if tokens is not None and seconds is not None and tokens >= 2 and seconds > 0:
        decode = tokens / seconds
    return replace(observation, draft_n=drafted, draft_n_accepted=accepted, decode_tok_s=decode)
