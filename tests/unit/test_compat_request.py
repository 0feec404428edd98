"""One request's mends (proxy/compat/request.py): which apply under which [compat] setting, and
the bytes each backend gets. A request no mend applies to keeps the client's own bytes object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.apis import Api
from proxy.compat.request import RequestMends, counted_body
from proxy.config.settings import CompatSettings
from supervisor.template_check import LateSystem

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compat"
LATE = {"messages": [{"role": "user", "content": "u"}, {"role": "system", "content": "late"}]}


def raw_fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def mends_of(
    api: Api,
    raw: bytes,
    verdicts: dict[str, LateSystem] | None = None,
    **settings: Any,
) -> RequestMends:
    body = orjson.loads(raw)
    found = verdicts or {}
    return RequestMends(CompatSettings(**settings), api, raw, body, found.get)


def test_a_plain_chat_request_keeps_its_bytes_on_every_backend() -> None:
    raw = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    mends = mends_of("chat", raw, {"a": "refused", "b": "in-place"})
    assert mends.raw_for("a") is raw and mends.raw_for("b") is raw
    assert mends.applied == [] and mends.refusal is None


def test_auto_rewrites_for_the_refusing_backend_only() -> None:
    raw = json.dumps(LATE).encode()
    verdicts: dict[str, LateSystem] = {
        "qwen": "refused",
        "gemma": "in-place",
        "deepseek": "hoisted",
        "remote": "unknown",
    }
    mends = mends_of("chat", raw, verdicts)
    for other in ("gemma", "deepseek", "remote", "not-checked"):
        assert mends.raw_for(other) is raw
    rewritten = orjson.loads(mends.raw_for("qwen"))
    assert rewritten["messages"][1] == {
        "role": "user",
        "content": "<system-reminder>\nlate\n</system-reminder>",
    }
    assert mends.applied == ["system_turns"]
    assert mends.raw_for("qwen") is mends.raw_for("qwen")  # written once per request


def test_on_rewrites_for_every_backend_and_off_for_none() -> None:
    raw = json.dumps(LATE).encode()
    on = mends_of("chat", raw, {"gemma": "in-place"}, system_turns="on")
    assert on.raw_for("gemma") is not raw and on.raw_for("unchecked") is not raw
    off = mends_of("chat", raw, {"qwen": "refused"}, system_turns="off")
    assert off.raw_for("qwen") is raw


def test_a_body_that_cannot_be_mended_goes_as_it_came_and_says_why() -> None:
    image = {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    raw = json.dumps({"messages": [{"role": "user", "content": "u"}, image]}).encode()
    mends = mends_of("chat", raw, {"qwen": "refused"})
    assert mends.raw_for("qwen") is raw
    assert mends.unmended is not None and "image_url" in mends.unmended


def test_claude_code_gets_both_its_mends() -> None:
    raw = raw_fixture("claude-code-turn1.json")
    mends = mends_of("messages", raw, {"qwen": "refused"})
    plain = orjson.loads(mends.raw_for("gemma"))
    assert plain["system"][0]["text"].endswith("cc_version=2.1.332.fff; cc_entrypoint=sdk-cli;")
    assert plain["messages"][1]["role"] == "system"
    mended = orjson.loads(mends.raw_for("qwen"))
    assert mended["messages"][1]["role"] == "user"
    assert mends.applied == ["session_prefix", "system_turns"]


def test_codex_default_model_is_mended_and_its_answer_rewritten() -> None:
    mends = mends_of("responses", raw_fixture("codex-default-model.json"))
    sent = orjson.loads(mends.raw_for("any"))
    assert "tools" in sent and all(x.get("type") != "additional_tools" for x in sent["input"])
    assert mends.tools and mends.stream_rewriter() is not None
    assert mends.applied == ["codex_additional_tools"]


def test_switches_off_leave_the_bytes() -> None:
    for name, raw, api in (
        ("session_prefix", raw_fixture("claude-code-turn1.json"), "messages"),
        ("codex_additional_tools", raw_fixture("codex-default-model.json"), "responses"),
        ("responses_input_items", raw_fixture("opencode-responses-turn2.json"), "responses"),
    ):
        mends = mends_of(api, raw, **{name: False})
        assert mends.raw_for("x") is raw, name
        assert mends.stream_rewriter() is None


def test_a_structured_output_request_on_messages_is_refused_unless_switched_off() -> None:
    raw = json.dumps({"messages": [], "output_config": {"format": {"type": "json_schema"}}})
    assert mends_of("messages", raw.encode()).refusal is not None
    assert mends_of("messages", raw.encode(), structured_output=False).refusal is None


def test_text_format_is_enforced_unless_switched_off() -> None:
    raw = json.dumps({"input": "hi", "text": {"format": {"type": "json_object"}}}).encode()
    sent = orjson.loads(mends_of("responses", raw).raw_for("x"))
    assert sent["response_format"] == {"type": "json_object"}
    assert mends_of("responses", raw, structured_output=False).raw_for("x") is raw


@pytest.mark.parametrize(
    ("path", "verdict", "changed"),
    [
        ("/v1/chat/completions/input_tokens", "refused", True),
        ("/v1/chat/completions/input_tokens", "in-place", False),
        ("/tokenize", "refused", False),
        ("/apply-template", "refused", False),  # shows what the backend itself renders
    ],
)
def test_token_counting_is_mended_like_generation(
    path: str, verdict: LateSystem, changed: bool
) -> None:
    raw = json.dumps(LATE).encode()
    out = counted_body(CompatSettings(), path, raw, json.loads(raw), "b", {"b": verdict}.get)
    assert (out is not raw) == changed


def test_a_counting_body_that_is_not_an_object_goes_as_it_came() -> None:
    for raw, parsed in ((b"", None), (b"[1]", [1]), (b"{not json", None)):
        path = "/v1/messages/count_tokens"
        out = counted_body(CompatSettings(), path, raw, parsed, "b", lambda _: "refused")
        assert out is raw


# --- any body: a mend never raises (the request would be a 500), it mends, refuses or passes -----

_scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(
    ["", "system", "developer", "user", "assistant", "message", "text", "input_text",
     "additional_tools", "namespace", "custom", "function", "custom_tool_call",
     "custom_tool_call_output", "reasoning", "json_schema", "json_object", "exec",
     "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli;"]
)  # fmt: skip
_keys = st.sampled_from(
    ["role", "content", "type", "text", "name", "tools", "input", "format", "schema", "call_id",
     "output", "arguments", "summary", "messages", "system", "instructions", "text", "model"]
)  # fmt: skip
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=30,
)
_bodies = st.dictionaries(
    st.sampled_from(
        ["messages", "input", "system", "instructions", "tools", "text", "output_config"]
    ),
    _values,
    max_size=5,
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(body=_bodies, api=st.sampled_from(["chat", "messages", "responses", "completions"]))
def test_any_body_is_mended_refused_or_passed_never_an_exception(
    body: dict[str, Any], api: Api
) -> None:
    raw = orjson.dumps(body)
    mends = RequestMends(CompatSettings(), api, raw, orjson.loads(raw), lambda _: "refused")
    out = mends.raw_for("any")
    assert isinstance(orjson.loads(out), dict)
    rewriter = mends.stream_rewriter()
    if rewriter is not None:
        rewriter.feed(b"event: x\ndata: " + raw + b"\n\n")
        mends.answer_body(orjson.dumps({"output": [body]}))
