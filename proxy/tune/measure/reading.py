"""One measured request: send it to a backend, read its telemetry as the proxy reads it.

The response is streamed and read with the proxy's own ``StreamTelemetry`` and
``make_observation``, so tune measures exactly what the router would learn from the same
answer: decode speed and prefill time from llama-server's ``timings`` where the API has them,
the clock plus the /metrics draft counters where it does not (Anthropic Messages).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import aiohttp

from proxy.apis import API_OF_PATH, DEPTH_KEY
from proxy.routing.classes import RequestClass
from proxy.routing.telemetry import (
    Observation,
    StreamTelemetry,
    make_observation,
)
from proxy.serving.spec_counters import read_spec_counters

_UNCLASSIFIED = RequestClass("", "prose")  # the class is decided later, at analysis


class MeasureError(RuntimeError):
    """The backend did not answer the request with a usable response."""

    def __init__(self, message: str, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail or message


@dataclass(frozen=True)
class Measurement:
    """One measured request of one setting; saved as a JSON line in the results."""

    setting: str  # DraftSetting.name
    item: str  # WorkItem.id
    repeat: int
    tag: str  # the marker line the prompt was sent with (see WorkItem.request)
    mode: str  # "per-process", "per-request" or "service" (through the running proxy)
    context_tokens: int | None
    cached_tokens: int | None
    output_tokens: int
    decode_tok_s: float | None
    prefill_s: float | None
    total_s: float | None
    draft_n: int | None
    draft_n_accepted: int | None
    others: float | None = None
    """Other requests decoding on the same process meanwhile (mean of the samples taken while
    it ran, through the service's /admin/backends); None: tune's own process, nothing else."""
    backend: str | None = None

    @classmethod
    def of(
        cls,
        obs: Observation,
        *,
        setting: str,
        item: str,
        repeat: int,
        tag: str,
        mode: str,
        others: float | None = None,
        backend: str | None = None,
    ) -> Measurement:
        return cls(
            setting=setting,
            item=item,
            repeat=repeat,
            tag=tag,
            mode=mode,
            context_tokens=obs.context_tokens,
            cached_tokens=obs.cached_tokens,
            output_tokens=obs.output_tokens or 0,
            decode_tok_s=obs.decode_tok_s,
            prefill_s=obs.prefill_s,
            total_s=obs.total_s,
            draft_n=obs.draft_n,
            draft_n_accepted=obs.draft_n_accepted,
            others=others,
            backend=backend,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def alone(self) -> bool:
        """Nothing else decoded on its process (to within half a request on average)."""
        return self.others is None or self.others < 0.5

    def observation(self, request_class: RequestClass, profile: str) -> Observation:
        """Back into the router's form, to seed its learned statistics."""
        return Observation(
            backend="tune",
            profile=profile,
            request_class=request_class,
            context_tokens=self.context_tokens,
            cached_tokens=self.cached_tokens,
            output_tokens=self.output_tokens,
            draft_n=self.draft_n,
            draft_n_accepted=self.draft_n_accepted,
            decode_tok_s=self.decode_tok_s,
            prefill_s=self.prefill_s,
            ttft_s=None,
            total_s=self.total_s,
            source="timings",
        )

    @property
    def decode_s(self) -> float | None:
        if self.decode_tok_s is None or self.decode_tok_s <= 0:
            return None
        return self.output_tokens / self.decode_tok_s


@dataclass(frozen=True)
class Answer:
    """One measured request: what the router would observe, and which backend served it (the
    proxy's X-MTP-Backend; None straight from a llama-server)."""

    observation: Observation
    backend: str | None


async def measure(
    session: aiohttp.ClientSession,
    base_url: str,
    path: str,
    body: dict[str, Any],
    *,
    clock_scale: float,
    depth: int | None,
    headers: Mapping[str, str] | None = None,
    started: Callable[[str | None], None] | None = None,
) -> Answer:
    """Send one request; what the router would observe of it (its class left blank).
    ``depth`` sets the per-request draft depth field; None leaves it out. ``started`` is called
    with the serving backend's name once the answer's headers arrived (the request is in flight
    there from then on)."""
    api = API_OF_PATH.get(path)
    if api is None:
        raise MeasureError(f"unsupported path {path}")
    if depth is not None:
        body = {**body, DEPTH_KEY: depth}
    # /metrics draft counters: straight from a llama-server only (the proxy has its own).
    counted = api == "messages" and headers is None
    before = await read_spec_counters(session, base_url) if counted else None
    sink = StreamTelemetry(api)
    sent = time.monotonic()
    async with session.post(base_url + path, json=body, headers=headers) as resp:
        if resp.status != 200:
            detail = (await resp.text())[:300]
            raise MeasureError(f"{path} answered {resp.status}: {detail}", resp.status, detail)
        backend = resp.headers.get("X-MTP-Backend")
        if started is not None:
            started(backend)
        async for chunk in resp.content.iter_any():
            sink.feed(chunk, time.monotonic())
    done = time.monotonic()
    usage = sink.result(done)
    delta = None
    if before is not None:
        after = await read_spec_counters(session, base_url)
        delta = after - before if after is not None else None
    obs = make_observation(
        usage,
        backend=base_url,
        profile="",
        request_class=_UNCLASSIFIED,
        sent_at=sent,
        done_at=done,
        spec_delta=delta,
        clock_scale=clock_scale,  # a time-compressed simulator's seconds, as the router reads them
    )
    if not obs.output_tokens:
        raise MeasureError(f"{path}: the answer reported no output tokens")
    return Answer(obs, backend)
