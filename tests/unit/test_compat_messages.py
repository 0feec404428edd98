"""The Messages mends (proxy/compat: session_prefix, output_format) on Claude Code's own bodies
(tests/fixtures/compat, Claude Code 2.1.332)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.compat.outcome import Refused
from proxy.compat.output_format import check_output_format
from proxy.compat.session_prefix import mend_session_prefix, normalized_header

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compat"


def fixture(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text("utf-8"))
    return body


def test_two_sessions_start_alike_once_mended() -> None:
    """Two sessions whose first prompts differ ("say hi", "Read notes.txt ..."): their billing
    headers differ in the digits after the version, and only there."""
    one, two = fixture("claude-code-say-hi.json"), fixture("claude-code-turn1.json")
    assert one["system"][0] != two["system"][0]
    assert one["system"][1:] == two["system"][1:]  # same directory: the agent prompt matches
    mended = [mend_session_prefix(b)["system"] for b in (one, two)]
    assert mended[0] == mended[1]
    assert (
        mended[0][0]["text"]
        == "x-anthropic-billing-header: cc_version=2.1.332.fff; cc_entrypoint=sdk-cli;"
    )


def test_every_turn_of_a_session_gets_the_same_header() -> None:
    headers = {
        json.dumps(mend_session_prefix(fixture(f"claude-code-turn{n}.json"))["system"][0])
        for n in range(1, 6)
    }
    assert len(headers) == 1


H = "x-anthropic-billing-header: "


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            H + "cc_version=2.1.101.e51; cc_entrypoint=cli; cch=a5145;You are Claude Code.",
            H + "cc_version=2.1.101.fff; cc_entrypoint=cli; cch=fffff;You are Claude Code.",
        ),
        (
            H + "cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;\nText cc_version=1.2.3.abc;",
            H + "cc_version=2.1.332.fff; cc_entrypoint=sdk-cli;\nText cc_version=1.2.3.abc;",
        ),
        ("You are helpful. cc_version=2.1.332.0b8;", "You are helpful. cc_version=2.1.332.0b8;"),
        (
            H + "cc_version=2.1.332; cc_entrypoint=cli;",
            H + "cc_version=2.1.332; cc_entrypoint=cli;",
        ),
    ],
)
def test_only_a_billing_header_of_that_form_changes(text: str, expected: str) -> None:
    assert normalized_header(text) == expected


def test_a_string_system_is_mended_too() -> None:
    body = {"system": "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli;"}
    assert mend_session_prefix(body)["system"].endswith("2.1.101.fff; cc_entrypoint=cli;")


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"system": "You are terse."},
        {"system": [{"type": "text", "text": "You are terse."}]},
        {"system": [{"type": "image"}]},
        {"system": []},
    ],
)
def test_a_body_without_that_header_is_the_same_object(body: dict[str, Any]) -> None:
    assert mend_session_prefix(body) is body


def test_the_client_body_is_never_changed() -> None:
    body = fixture("claude-code-turn1.json")
    kept = copy.deepcopy(body)
    mend_session_prefix(body)
    assert body == kept


# --- output_config.format -------------------------------------------------------------------------


def test_a_structured_output_format_is_refused_naming_the_field() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {"output_config": {"format": {"type": "json_schema", "schema": schema}}}
    with pytest.raises(Refused, match=r"output_config\.format") as refused:
        check_output_format(body)
    assert "response_format" in str(refused.value)


@pytest.mark.parametrize(
    "body",
    [
        {"output_config": {"effort": "medium"}},  # what Claude Code sends
        {"output_config": {"format": None}},
        {},
    ],
)
def test_other_output_config_passes(body: dict[str, Any]) -> None:
    check_output_format(body)


def test_claude_code_bodies_pass() -> None:
    for n in range(1, 6):
        check_output_format(fixture(f"claude-code-turn{n}.json"))
