"""Does a backend's chat template take a system message that is not first? Asked at ready.

Agents send system (or developer) messages after the first user turn: Claude Code's
mid-conversation system turns, Codex's several leading developer items, gptme's three system
messages. Most chat templates render such a message where it stands; DeepSeek V3.1's moves every
system message to the front; Qwen3.5/3.6's refuses it, and llama-server answers every such request
with a 500 ("System message must be at the beginning."). Nothing in /props says which, so render a
two-message conversation, ``[user, system]``, with ``POST /apply-template`` (no generation, no slot,
stock and patched builds alike; llama-server maps ``developer`` to ``system`` before the template,
so one check covers both):

- a non-200 answer, while ``[system, user]`` renders: ``refused``;
- 200 with the system text after the user text: ``in-place``;
- 200 with the system text before the user text: ``hoisted``;
- anything else (no /apply-template: 404, 405, 501; no answer; ``[system, user]`` refused as well;
  a prompt without both texts): ``unknown``, with the reason.

The proxy rewrites such messages for a backend found ``refused`` (proxy.compat.system_turns).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import aiohttp

LateSystem = Literal["in-place", "hoisted", "refused", "unknown"]
"""What a backend's chat template does with a system message that is not first."""

PATH = "/apply-template"
USER_TEXT = "mtp-check-user"
SYSTEM_TEXT = "mtp-check-system"
LATE_SYSTEM = [
    {"role": "user", "content": USER_TEXT},
    {"role": "system", "content": SYSTEM_TEXT},
]
LEADING_SYSTEM = [
    {"role": "system", "content": SYSTEM_TEXT},
    {"role": "user", "content": USER_TEXT},
]
# No such route: llama-server's 404 "File Not Found", a proxy's 405 or 501.
_NO_ROUTE = frozenset({404, 405, 501})


@dataclass(frozen=True)
class ChatTemplateCheck:
    late_system: LateSystem
    reason: str  # what was seen, for the log and /admin/backends
    seconds: float

    def as_json(self) -> dict[str, object]:
        return {"late_system": self.late_system, "reason": self.reason, "seconds": self.seconds}


class _CheckFailed(Exception):
    """The backend did not answer the check usefully; the message says how."""


async def check_chat_template(
    session: aiohttp.ClientSession, base_url: str, *, timeout_s: float
) -> ChatTemplateCheck:
    """Render ``[user, system]`` (and, if that is refused, ``[system, user]``) on the backend."""
    started = time.monotonic()

    def result(late_system: LateSystem, reason: str) -> ChatTemplateCheck:
        return ChatTemplateCheck(late_system, reason, round(time.monotonic() - started, 3))

    url = base_url.rstrip("/") + PATH
    try:
        async with asyncio.timeout(timeout_s):
            status, answer = await _render(session, url, LATE_SYSTEM)
            if status in _NO_ROUTE:
                return result("unknown", f"{PATH} answered {status}: not served here")
            if status != 200:
                leading, _ = await _render(session, url, LEADING_SYSTEM)
                if leading != 200:
                    return result(
                        "unknown", f"{PATH} refused a leading system message too ({leading})"
                    )
                return result("refused", f"a late system message: {status} {_quote(answer)}")
    except TimeoutError:
        return result("unknown", f"check failed: no answer within {timeout_s:g}s")
    except _CheckFailed as exc:
        return result("unknown", f"check failed: {exc}")
    return _placed(answer, result)


def _placed(
    answer: str, result: Callable[[LateSystem, str], ChatTemplateCheck]
) -> ChatTemplateCheck:
    """In place or hoisted: where the template put the system text, from the rendered prompt."""
    try:
        prompt = json.loads(answer)["prompt"]
    except (ValueError, KeyError, TypeError):
        return result("unknown", f"{PATH} answered 200 without a prompt: {_quote(answer)}")
    if not isinstance(prompt, str):
        return result("unknown", f"{PATH} answered 200 without a prompt: {_quote(answer)}")
    user, system = prompt.find(USER_TEXT), prompt.find(SYSTEM_TEXT)
    if user < 0 or system < 0:
        return result("unknown", "the rendered prompt lacks the user or the system text")
    if system < user:
        return result("hoisted", "a late system message is rendered before the user turn")
    return result("in-place", "a late system message is rendered where it stands")


async def _render(
    session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]
) -> tuple[int, str]:
    try:
        async with session.post(url, json={"messages": messages}) as response:
            return response.status, await response.text(errors="replace")
    except (aiohttp.ClientError, OSError) as exc:
        raise _CheckFailed(f"{PATH}: {type(exc).__name__}: {exc}") from None


def _quote(text: str) -> str:
    """The gist of an answer: llama-server's Jinja errors end with the exception's message."""
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text
    message = str(message).strip()
    tail = message.rsplit("Error: ", 1)[-1] if "Jinja Exception" in message else message
    return tail[:200]
