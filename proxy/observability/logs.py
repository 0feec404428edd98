"""Logging: structlog JSON lines in production (journald keeps them), a console renderer on a tty.

Everything goes through one processor chain, including what the standard library's loggers say
(aiohttp, asyncio), so the journal holds nothing but JSON lines. The chain redacts secrets and
gives the per-request line (event "request") the same fields every time, so one `jq` filter reads
them all: a field the request did not get to (a refused request has no profile) is null. The
console rendering (a terminal) leaves such empty fields out.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any, TextIO

import orjson
import structlog
from aiohttp.http_exceptions import HttpProcessingError
from structlog.typing import Processor

from supervisor.urls import shown as shown_url

REDACTED = "[redacted]"

# The canonical request line, in this order: who, where it went, how it ended, what it cost.
REQUEST_FIELDS = (
    "request_id",
    "method",
    "path",
    "user_agent",
    "model",
    "api",
    "profile",
    "request_class",
    "load_level",
    "reason",
    "backend",
    "status",
    "stream",
    "duration_s",
    "ttft_s",
    "context_tokens",
    "cached_tokens",
    "output_tokens",
    "draft_n",
    "draft_accepted",
    "acceptance",
    "decode_tok_s",
    "error",
)

_SECRET_KEYS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "x-admin-key",
        "api_key",
        "api_keys",
        "admin_key",
        "password",
        "token",
        "secret",
        "cookie",
    }
)
# Command-line flags whose next argument is a credential (llama-server's own, in argv lines).
_SECRET_FLAGS = frozenset({"--api-key", "--hf-token", "-hft"})
_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)\s+[\w.~+/=-]+")
_URL_USERINFO = r"://[^/\s]*@"  # a URL with credentials: its password is masked (supervisor.urls)
_MIN_SECRET_LENGTH = 4  # shorter configured "secrets" would redact ordinary words


class Redactor:
    """A processor that never lets a credential reach a log line, whatever a caller bound:
    secret-named keys (at any depth), `Bearer ...` strings, the password in a URL's userinfo,
    the value after `--api-key` in an argv list, and every configured key (admin and client)
    wherever it appears."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        known = sorted({s for s in secrets if len(s) >= _MIN_SECRET_LENGTH}, key=len, reverse=True)
        self._known = re.compile("|".join(map(re.escape, known))) if known else None
        # One scan tells the (nearly all) clean strings from those worth the substitutions.
        suspects = [_CREDENTIAL.pattern, _URL_USERINFO, *(map(re.escape, known))]
        self._suspect = re.compile("|".join(suspects))

    def __call__(
        self, _logger: Any, _method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        for key, value in event.items():
            if key.startswith("_"):  # structlog's own bookkeeping (the stdlib record)
                continue
            event[key] = REDACTED if key.lower() in _SECRET_KEYS else self._scrub(value)
        return event

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._scrub_text(value)
        if isinstance(value, Mapping):
            return {
                k: REDACTED if str(k).lower() in _SECRET_KEYS else self._scrub(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return self._scrub_argv(value)
        return value

    def _scrub_text(self, text: str) -> str:
        if self._suspect.search(text) is None:
            return text
        text = shown_url(_CREDENTIAL.sub(lambda m: f"{m.group(1)} {REDACTED}", text))
        return self._known.sub(REDACTED, text) if self._known else text

    def _scrub_argv(self, items: list[Any] | tuple[Any, ...]) -> list[Any]:
        scrubbed: list[Any] = []
        for item in items:
            previous = scrubbed[-1] if scrubbed else None
            if isinstance(previous, str) and previous in _SECRET_FLAGS:
                scrubbed.append(REDACTED)
            elif isinstance(item, str) and item.partition("=")[1] and _flag(item) in _SECRET_FLAGS:
                scrubbed.append(f"{_flag(item)}={REDACTED}")
            else:
                scrubbed.append(self._scrub(item))
        return scrubbed


def _flag(argument: str) -> str:
    return argument.partition("=")[0]


def _orjson_text(event: Any, **_: Any) -> str:
    # orjson renders a request line ~5x faster than json.dumps; str() keeps odd values readable.
    try:
        return orjson.dumps(event, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # what orjson refuses outright, such as integers past 64 bits
        return json.dumps(event, default=str)


def canonical_request(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Give every "request" line all of REQUEST_FIELDS, in order, before anything else bound."""
    if event.get("event") != "request":
        return event
    ordered: dict[str, Any] = {"event": "request"}
    ordered.update((name, event.get(name)) for name in REQUEST_FIELDS)
    ordered.update(event)
    return ordered


def drop_empty(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """For the console only: leave out the fields that are None (a request line's ~20 fields
    the request never got to). JSON keeps them: one jq filter reads every line."""
    return {key: value for key, value in event.items() if value is not None}


def configure_logging(
    level: str = "info",
    fmt: str = "auto",
    *,
    secrets: Iterable[str] = (),
    stream: TextIO | None = None,
) -> None:
    """Set up structlog and the standard library's logging to write to `stream` (stdout)."""
    out = stream if stream is not None else sys.stdout
    on_tty = out.isatty()
    console = fmt == "console" or (fmt == "auto" and on_tty)
    renderer: Processor = (
        structlog.dev.ConsoleRenderer(colors=on_tty)
        if console
        else structlog.processors.JSONRenderer(serializer=_orjson_text)
    )
    shared: list[Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,  # before redaction: tracebacks quote messages
        Redactor(secrets),
        canonical_request,
    ]
    if console:
        shared.append(drop_empty)
    number: int = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    _route_stdlib_logging(out, number, shared, renderer)


def _route_stdlib_logging(
    out: TextIO, number: int, shared: list[Processor], renderer: Processor
) -> None:
    # aiohttp's and asyncio's own messages (e.g. "Error handling request") get the same level
    # threshold, redaction and rendering as ours, instead of bare text on stderr.
    handler = logging.StreamHandler(out)
    handler.addFilter(_MalformedRequests(number))
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(number)


class _MalformedRequests(logging.Filter):
    """aiohttp logs every request its parser refuses (answered 400) at ERROR with a traceback
    quoting the offending bytes: a client's mistake, and one any client can repeat to flood the
    journal. Such a record becomes one short info line; the level threshold then applies."""

    _REASON_CHARS = 200

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self._threshold = threshold

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            lines = str(error.message).strip().splitlines()
            reason = lines[0][: self._REASON_CHARS] if lines else ""
            record.msg, record.args = (
                "malformed HTTP request refused (%s): %s",
                (error.code, reason),
            )
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
        return record.levelno >= self._threshold
