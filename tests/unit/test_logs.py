"""The logging chain in-process: the standard library's records go through it, secrets are
redacted, any value renders as JSON, request ids never repeat (a real proxy's logs:
tests/proxy/test_logs.py)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from proxy.observability.logs import REDACTED, Redactor, configure_logging
from proxy.state import RequestIds


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Logging configured onto a buffer; the process's logging restored afterwards."""
    root = logging.getLogger()
    before, level = root.handlers[:], root.level
    out = io.StringIO()
    configure_logging("info", "json", secrets=["hunter2-admin"], stream=out)
    installed = [handler for handler in root.handlers if handler not in before]
    assert installed
    yield out
    for handler in installed:  # pytest manages its own capture handlers phase by phase
        root.removeHandler(handler)
    root.setLevel(level)
    structlog.reset_defaults()


def test_standard_library_logging_goes_through_the_same_chain(captured: io.StringIO) -> None:
    try:
        raise RuntimeError("boom with Bearer abc.def-123")
    except RuntimeError:
        logging.getLogger("aiohttp.server").exception("Error handling request")
    logging.getLogger("aiohttp.access").debug("below the configured level")
    (line,) = [json.loads(raw) for raw in captured.getvalue().splitlines()]
    assert line["event"] == "Error handling request"
    assert (line["level"], line["logger"]) == ("error", "aiohttp.server")
    assert "RuntimeError" in line["exception"] and "abc.def-123" not in line["exception"]


def test_redactor_covers_keys_headers_argv_and_known_secrets() -> None:
    redact = Redactor(["hunter2-admin", "sk-1", "x"])  # "x": too short to be redacted anywhere
    event = redact(
        None,
        "info",
        {
            "event": "spawned",
            "api_key": "anything",
            "headers": {"Authorization": "Bearer abc", "Accept": "x/y"},
            "argv": ["llama-server", "--api-key", "s3cret", "--hf-token=hf_123", "-c", "8"],
            "error": "key hunter2-admin rejected; sent Basic dXNlcjpwdw==",
            "count": 3,
        },
    )
    assert event == {
        "event": "spawned",
        "api_key": REDACTED,
        "headers": {"Authorization": REDACTED, "Accept": "x/y"},
        "argv": ["llama-server", "--api-key", REDACTED, f"--hf-token={REDACTED}", "-c", "8"],
        "error": f"key {REDACTED} rejected; sent Basic {REDACTED}",
        "count": 3,
    }


def test_values_orjson_refuses_still_render_as_json(captured: io.StringIO) -> None:
    structlog.get_logger("proxy.test").info("odd", huge=2**70, keyed={1: "x"}, obj=object())
    (line,) = [json.loads(raw) for raw in captured.getvalue().splitlines()]
    assert line["huge"] == 2**70 and line["keyed"] == {"1": "x"} and "object" in line["obj"]


def test_generated_request_ids_are_uuid_sized_hex_and_never_repeat() -> None:
    first, restarted = RequestIds(), RequestIds()
    ids = [first.new() for _ in range(1000)] + [restarted.new() for _ in range(1000)]
    assert len(set(ids)) == len(ids)  # a restart (a new prefix) does not repeat old ids
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
