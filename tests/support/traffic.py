"""Client traffic for the observability tests: real requests to a running proxy over loopback,
and what each answer reported (status, profile, tokens, drafts), to compare with what /metrics,
the log and `mtp-proxy status` say afterwards."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tests.support.harness import ADMIN_KEY, ProxyProcess

PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
MODEL = "mtp-demo"
UNROUTED = "none"  # profile/model label of a request refused before routing


@dataclass(frozen=True)
class Sent:
    """One request and what its answer said."""

    api: str
    stream: bool
    request_id: str
    status: int
    profile: str  # from the answer's X-MTP-Profile; "none" when the proxy refused it
    reason: str | None  # from X-MTP-Route-Reason
    output_tokens: int = 0
    context_tokens: int = 0
    draft_n: int = 0
    draft_accepted: int = 0

    @property
    def routed(self) -> bool:
        return self.profile != UNROUTED


def body_for(api: str, *, stream: bool, text: str = "hello there", max_tokens: int = 16) -> Any:
    """A small request of `api` (a prompt far below the first context bucket: class <4k)."""
    if api == "chat":
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
        if stream:
            body["stream_options"] = {"include_usage": True}
    elif api == "messages":
        body = {"messages": [{"role": "user", "content": text}]}
    elif api == "responses":
        body = {"input": text}
    else:
        body = {"prompt": text}
    token_field = "max_output_tokens" if api == "responses" else "max_tokens"
    return {"model": MODEL, "stream": stream, token_field: max_tokens, **body}


def send(
    url: str,
    api: str,
    body: Any,
    *,
    headers: Mapping[str, str] | None = None,
    raw: bytes | None = None,
) -> Sent:
    """POST `body` (or `raw` bytes) to `api` with a fresh X-Request-Id; read the whole answer."""
    request_id = uuid.uuid4().hex
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        url + PATHS[api],
        data=data,
        headers={"Content-Type": "application/json", "X-Request-Id": request_id, **(headers or {})},
    )
    stream = isinstance(body, dict) and bool(body.get("stream"))
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, answer, head = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        status, answer, head = error.code, error.read(), error.headers
    sent = Sent(
        api=api,
        stream=stream,
        request_id=request_id,
        status=status,
        profile=head.get("X-MTP-Profile", UNROUTED),
        reason=head.get("X-MTP-Route-Reason"),
    )
    return _with_usage(sent, answer) if status == 200 else sent


def _with_usage(sent: Sent, answer: bytes) -> Sent:
    events = list(_sse_events(answer)) if sent.stream else [json.loads(answer)]
    output = context = drafted = accepted = 0
    for event in events:
        usage = event.get("usage") or (event.get("response") or {}).get("usage")
        if isinstance(usage, dict):
            reported = usage.get("completion_tokens", usage.get("output_tokens"))
            output = reported if isinstance(reported, int) else output
            if "cache_read_input_tokens" in usage:  # Anthropic: input excludes cache reads
                context = usage.get("input_tokens", 0) + usage["cache_read_input_tokens"]
        timings = event.get("timings")
        if isinstance(timings, dict):
            context = timings["prompt_n"] + timings["cache_n"]
            drafted = timings.get("draft_n", 0)  # absent, not 0, when nothing was drafted
            accepted = timings.get("draft_n_accepted", 0)
    return replace(
        sent,
        output_tokens=output,
        context_tokens=context,
        draft_n=drafted,
        draft_accepted=accepted,
    )


def _sse_events(answer: bytes) -> Iterator[dict[str, Any]]:
    for line in answer.decode().splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            yield json.loads(line[5:])


def wait_all_ready(proxy: ProxyProcess, timeout: float = 30.0) -> None:
    """/health is 200 once one backend per model is ready; pinned traffic needs all of them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, payload = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
        if status == 200 and all(b["state"] == "ready" for b in payload["backends"]):
            return
        time.sleep(0.05)
    raise TimeoutError(f"backends not all ready after {timeout}s:\n{proxy.tail()}")


def standard_mix(url: str, *, headers: Mapping[str, str] | None = None) -> list[Sent]:
    """Per profile: 3 chat non-stream + 2 chat stream pinned with X-MTP-Profile; then one
    messages (pinned to off: its acceptance comes from backend counters, not the answer), one
    responses stream, one completions, one unknown model (404) and one body that is no JSON
    object (400)."""
    sent = []
    for profile in ("off", "min", "max"):
        pin = {**(headers or {}), "X-MTP-Profile": profile}
        for stream in (False, False, False, True, True):
            sent.append(send(url, "chat", body_for("chat", stream=stream), headers=pin))
    off = {**(headers or {}), "X-MTP-Profile": "off"}
    sent.append(send(url, "messages", body_for("messages", stream=False), headers=off))
    sent.append(send(url, "responses", body_for("responses", stream=True), headers=headers))
    sent.append(send(url, "completions", body_for("completions", stream=False), headers=headers))
    missing = {**body_for("chat", stream=False), "model": "no-such-model"}
    sent.append(send(url, "chat", missing, headers=headers))
    sent.append(send(url, "chat", None, raw=b"[1, 2, 3]", headers=headers))
    return sent


async def watch_in_flight(proxy: ProxyProcess, seen: dict[str, int], stop: asyncio.Event) -> None:
    """Record the most requests the proxy ever had on each backend at once."""
    while not stop.is_set():
        status, body = await asyncio.to_thread(
            proxy.get_json, "/admin/backends", admin_key=ADMIN_KEY
        )
        assert status == 200
        for row in body["backends"]:
            seen[row["name"]] = max(seen.get(row["name"], 0), row["in_flight"])
        await asyncio.sleep(0.05)
