"""The mends of one request: which apply, in what order, and the bytes each backend gets.

The handler has parsed the body once already (orjson); a mend reads that dict, never the bytes,
and the body is written again (orjson) only when a mend changed it. A request no mend applies to
(every chat request to a backend whose template takes late system messages, every completion)
keeps its own bytes: the depth key is spliced into them as before (serving.depth_field).

Backend-independent mends run at once: a refusal (Messages output_config.format) is answered
before routing. The system-turn rewrite depends on the backend's template check, so it runs for
the backend a request is routed to, once per request (a retry on another backend reuses it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson

from proxy.apis import Api
from proxy.compat.codex_tools import (
    CodexToolEvents,
    ToolMap,
    has_additional_tools,
    mend_additional_tools,
    rewritten_body,
    tool_map,
)
from proxy.compat.input_items import check_item_references, mend_input_items
from proxy.compat.outcome import Refused, Unmendable
from proxy.compat.output_format import check_output_format
from proxy.compat.session_prefix import mend_session_prefix
from proxy.compat.system_turns import mend_system_turns
from proxy.compat.text_format import mend_text_format
from proxy.compat.tool_choice import mend_named_tool_choice
from proxy.config.settings import CompatSettings
from supervisor.template_check import LateSystem

Mend = Callable[[dict[str, Any]], dict[str, Any]]
LateSystemOf = Callable[[str], LateSystem | None]
"""A backend's template-check verdict by name (None: not checked, or no such backend)."""
COUNTING_APIS: dict[str, Api] = {
    "/v1/messages/count_tokens": "messages",
    "/v1/responses/input_tokens": "responses",
    "/responses/input_tokens": "responses",
    "/v1/chat/completions/input_tokens": "chat",
    "/chat/completions/input_tokens": "chat",
}
"""The token-counting routes and the API whose prompt they count."""


class RequestMends:
    """One request's mends. `refusal` is the 400's message if it must not be forwarded;
    `applied` names the mends its body got; `unmended` says why a needed one could not be."""

    __slots__ = (
        "_common_changed",
        "_late_system_of",
        "_mended_raw",
        "_settings",
        "_with_system",
        "api",
        "applied",
        "body",
        "raw",
        "refusal",
        "tools",
        "unmended",
    )

    def __init__(
        self,
        settings: CompatSettings,
        api: Api,
        raw: bytes,
        body: dict[str, Any],
        late_system_of: LateSystemOf,
    ) -> None:
        self._settings = settings
        self._late_system_of = late_system_of
        self.api, self.raw = api, raw
        self.applied: list[str] = []
        self.unmended: str | None = None
        self.refusal: str | None = None
        self.tools: ToolMap | None = None  # Codex's additional_tools: the answer is rewritten
        self._mended_raw: bytes | None = None
        self._with_system: bytes | None = None
        try:
            self.body = self._common(body)
        except Refused as refused:
            self.body, self.refusal = body, str(refused)
        self._common_changed = self.body is not body

    def raw_for(self, backend: str) -> bytes:
        """The bytes to forward to this backend."""
        if not self._rewrites_system(backend):
            return self._common_raw()
        if self._with_system is None:
            try:
                mended = mend_system_turns(self.api, self.body)
            except Unmendable as exc:
                self.unmended = f"system_turns: {exc}"
                mended = self.body
            if mended is self.body:
                self._with_system = self._common_raw()
            else:
                self.applied.append("system_turns")
                self._with_system = orjson.dumps(mended)
        return self._with_system

    def answer_body(self, body: bytes) -> bytes:
        """A complete (non-stream) answer, as the client expects it."""
        return rewritten_body(body, self.tools) if self.tools else body

    def stream_rewriter(self) -> CodexToolEvents | None:
        """What rewrites the answer's stream events, if anything does."""
        return CodexToolEvents(self.tools) if self.tools else None

    def _rewrites_system(self, backend: str) -> bool:
        setting = self._settings.system_turns
        if setting == "auto":
            return self.api in ("chat", "messages", "responses") and (
                self._late_system_of(backend) == "refused"
            )
        return setting == "on"

    def _common_raw(self) -> bytes:
        if not self._common_changed:
            return self.raw
        if self._mended_raw is None:
            self._mended_raw = orjson.dumps(self.body)
        return self._mended_raw

    def _common(self, body: dict[str, Any]) -> dict[str, Any]:
        """The backend-independent mends. Raises Refused."""
        settings = self._settings
        if self.api == "messages":
            if settings.structured_output:
                check_output_format(body)
            if settings.session_prefix:
                body = self._apply("session_prefix", mend_session_prefix, body)
        elif self.api == "chat" and settings.named_tool_choice:
            body = self._apply("named_tool_choice", mend_named_tool_choice, body)
        elif self.api == "responses":
            if settings.codex_additional_tools:
                if has_additional_tools(body):
                    self.tools = tool_map(body) or None
                body = self._apply("codex_additional_tools", mend_additional_tools, body)
            if settings.responses_input_items:
                check_item_references(body)
                body = self._apply("responses_input_items", mend_input_items, body)
            if settings.structured_output:
                body = self._apply("structured_output", mend_text_format, body)
        return body

    def _apply(self, name: str, mend: Mend, body: dict[str, Any]) -> dict[str, Any]:
        mended = mend(body)
        if mended is not body:
            self.applied.append(name)
        return mended


class Rewriter(Protocol):
    """Changes a stream's bytes on their way (serving.forward.ChunkRewriter)."""

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class Chained:
    """Two stream rewriters, one after the other (a Rewriter)."""

    __slots__ = ("_first", "_second")

    def __init__(self, first: Rewriter, second: Rewriter) -> None:
        self._first, self._second = first, second

    def feed(self, chunk: bytes) -> bytes:
        return self._second.feed(self._first.feed(chunk))

    def flush(self) -> bytes:
        return self._second.feed(self._first.flush()) + self._second.flush()


def counted_body(
    settings: CompatSettings,
    path: str,
    raw: bytes,
    parsed: object,
    backend: str,
    late_system: LateSystemOf,
) -> bytes:
    """A forwarded request's body (``raw``, and ``parsed``: what it parsed to, None when it is
    no JSON): a token-counting one mended as its generation twin would be (the count is of
    the prompt the backend would process; the refusing template refuses the unmended one
    too), any other as it came."""
    api = COUNTING_APIS.get(path)
    if api is None or not isinstance(parsed, dict):
        return raw  # the backend judges it
    return RequestMends(settings, api, raw, parsed, late_system).raw_for(backend)
