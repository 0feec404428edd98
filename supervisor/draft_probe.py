"""Does a backend honour the per-request draft depth? A behavioural probe, run when it turns ready.

Nothing a llama-server reports says whether it reads ``"speculative.n_max"`` from a request
(stock llama.cpp 11434 ignores the key; the build from ``patches/llama.cpp`` honours it; /props
says nothing usable). So ask it: the same greedy completion twice, first plain, then with
``"speculative.n_max": 0``, and read ``timings.draft_n`` (absent when nothing was drafted).

The prompt repeats one line and the answer is long enough for every speculative type to draft:
the n-gram types (``ngram-*``) draft only what they find earlier in the text, so a short answer
to an ordinary prompt drafts nothing there, whether the field is honoured or not. The second
request comes after the first on the same text, so a drafter that keeps state across requests
(the n-gram pools and caches) has at least as much to draft from the second time.

- ``per-request``: the plain request drafted, the one with 0 did not: the field is honoured.
- ``ignored``: the request with 0 drafted: the field is ignored (stock llama.cpp). A probe that
  failed (no answer, an error, no timings) counts as ``ignored`` too, never as honoured, and
  says why.
- ``undecided``: neither drafted, so there is nothing to tell by: speculation that drafts
  nothing here (a draft model whose vocabulary does not match, a drafter with nothing to match),
  or none at all on a remote backend.
- ``none``: started without speculation (known from its command line; nothing is asked).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from supervisor.completion import DEPTH_KEY, PATH, NoTimings, completion_timings

DraftControl = Literal["per-request", "ignored", "undecided", "none"]

# A line said over and over, the last time cut short: greedy decoding carries on with it, so the
# n-gram drafters match from the first token on and a draft model or MTP head is sure of itself.
# The line is long (27 tokens for Gemma 3): ngram-simple drafts only from a match followed by at
# least its lookup length (12 tokens by default) of text, and takes the nearest match.
_LINE = (
    "The quick brown fox jumps over the lazy dog while the small grey cat sleeps under the old "
    "wooden table by the open kitchen window.\n"
)
PROMPT = _LINE * 5 + "The quick brown fox"
# Enough tokens for several draft steps once the answer is in step with the prompt (the first
# draft comes right after the first sampled token); a few hundred ms on a 270M model on a CPU.
MAX_TOKENS = 32


@dataclass(frozen=True)
class DraftProbe:
    control: DraftControl
    reason: str  # what was seen, for the log and /admin/backends
    seconds: float
    failed: bool = False  # the backend did not answer usefully: control is "ignored"


class _ProbeFailed(Exception):
    """The backend did not answer the probe usefully; the message says how."""


async def probe_draft_control(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    model: str,
    speculative: bool,
    timeout_s: float,
) -> DraftProbe:
    """Ask the backend at base_url; ``speculative=False`` (known from its argv) needs no request."""
    started = time.monotonic()

    def result(control: DraftControl, reason: str, failed: bool = False) -> DraftProbe:
        return DraftProbe(control, reason, round(time.monotonic() - started, 3), failed)

    if not speculative:
        return result("none", "started without speculation (no --spec-type)")
    try:
        async with asyncio.timeout(timeout_s):
            plain = await _drafted(session, base_url, model, None)
            zero = await _drafted(session, base_url, model, 0)
    except TimeoutError:
        return result("ignored", f"probe failed: no answer within {timeout_s:g}s", True)
    except _ProbeFailed as exc:
        return result("ignored", f"probe failed: {exc}", True)
    if zero > 0:
        return result("ignored", f"drafted {zero} tokens with {DEPTH_KEY} 0 ({plain} without)")
    if plain == 0:
        return result(
            "undecided", f"drafted nothing on a repeating prompt, with or without {DEPTH_KEY}"
        )
    return result("per-request", f"drafted {plain} tokens without {DEPTH_KEY}, none with 0")


async def _drafted(
    session: aiohttp.ClientSession, base_url: str, model: str, depth: int | None
) -> int:
    """Tokens the backend drafted for the probe's greedy completion (0 when draft_n is absent)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": False,
    }
    if depth is not None:
        body[DEPTH_KEY] = depth
    what = PATH + ("" if depth is None else f" with {DEPTH_KEY} {depth}")
    try:
        timings = await completion_timings(session, base_url, body, what)
    except NoTimings as exc:
        raise _ProbeFailed(str(exc)) from None
    drafted = timings.get("draft_n", 0)
    if not isinstance(drafted, int) or isinstance(drafted, bool) or drafted < 0:
        raise _ProbeFailed(f"{what}: timings.draft_n is {drafted!r}")
    return drafted
