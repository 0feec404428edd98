"""Request features for each API format, content kind, session key, tolerance, calibration."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.decide_micro import AGENT_SYSTEM, agent_request, code_text, prose_text, short_chat
from proxy.routing.features import (
    IMAGE_TOKENS,
    TEMPLATE_TOKENS_PER_MESSAGE,
    Api,
    FeatureError,
    RequestFeatures,
    extract_features,
    fenced_share,
)
from proxy.routing.stats import TokenCalibrator


def feats(
    api: Api,
    body: Any,
    *,
    cpt: float = 4.0,
    session: str | None = None,
    pin: str | None = None,
) -> RequestFeatures:
    return extract_features(api, body, chars_per_token=cpt, session_header=session, pin_header=pin)


DIFF = """--- a/store.py
+++ b/store.py
@@ -10,7 +10,8 @@ class Store:
-    def load(self, key):
-        return self._cache[key]
+    def load(self, key: str) -> bytes:
+        if key not in self._cache:
+            self._cache[key] = self._read(key)
+        return self._cache[key]
"""


# --- chat -------------------------------------------------------------------------------


def test_chat_string_content_counts_chars_and_tokens() -> None:
    body = short_chat()
    f = feats("chat", body, cpt=4.0)
    chars = sum(len(m["content"]) for m in body["messages"])
    assert f.api == "chat"
    assert f.model == "mtp-demo"
    assert f.prompt_chars == chars
    assert f.messages == len(body["messages"])
    assert f.est_prompt_tokens == chars // 4 + TEMPLATE_TOKENS_PER_MESSAGE * f.messages
    assert f.kind == "prose"
    assert f.max_tokens == 256
    assert f.stream is True
    assert f.has_tools is False
    assert f.agentic is False
    assert f.session_key is not None


def test_chat_content_parts_images_and_tool_traffic() -> None:
    args = json.dumps({"path": "src/app.py", "content": code_text(800)})
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "sys"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look at this"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + "A" * 9000},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "write", "arguments": args},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok, written"},
        ],
        "tools": [{"type": "function", "function": {"name": "write", "parameters": {}}}],
        "max_completion_tokens": 77,
        "max_tokens": 5,
    }
    f = feats("chat", body, cpt=4.0)
    text = len("sys") + len("look at this") + len("write") + len(args) + len("ok, written")
    tools_chars = f.prompt_chars - text
    assert 0 < tools_chars < 100  # the tool schema counts, the image's base64 does not
    assert f.images == 1
    assert f.est_prompt_tokens == (
        f.prompt_chars // 4 + IMAGE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * f.messages
    )
    assert f.max_tokens == 77  # max_completion_tokens wins over the legacy max_tokens
    assert f.has_tools
    assert f.kind == "code"
    assert f.agentic


def test_chat_without_system_or_user_has_no_prefix_session() -> None:
    f = feats("chat", {"messages": [{"role": "assistant", "content": "hi"}]})
    assert f.session_key is None


# --- completions ----------------------------------------------------------------------------


def test_completions_prompt_forms() -> None:
    assert feats("completions", {"prompt": "abcd" * 100}).prompt_chars == 400
    assert feats("completions", {"prompt": ["ab", "cd"]}).prompt_chars == 4
    ids = feats("completions", {"prompt": [1, 2, 3, 4, 5], "max_tokens": 9})
    assert ids.token_ids == 5
    assert ids.est_prompt_tokens == 5
    assert ids.max_tokens == 9
    nested = feats("completions", {"prompt": [[1, 2], [3, 4, 5]]})
    assert nested.token_ids == 5


def test_completions_session_key_is_the_prompt_head() -> None:
    a = feats("completions", {"prompt": "shared prefix " * 10 + "A"})
    b = feats("completions", {"prompt": "shared prefix " * 10 + "B"})
    assert a.session_key is not None
    assert a.session_key != b.session_key


# --- responses ------------------------------------------------------------------------------


def test_responses_string_input_and_instructions() -> None:
    f = feats(
        "responses",
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": "Tell me a story.",
            "max_output_tokens": 300,
            "stream": False,
        },
    )
    assert f.prompt_chars == len("Be brief.") + len("Tell me a story.")
    assert f.max_tokens == 300
    assert f.stream is False
    assert f.session_key is not None


def test_responses_items_with_function_calls() -> None:
    out = code_text(1500)
    body = {
        "model": "m",
        "instructions": AGENT_SYSTEM,
        "input": [
            {"role": "user", "content": "fix the bug"},
            {"type": "function_call", "call_id": "c", "name": "read", "arguments": '{"p":"a.py"}'},
            {"type": "function_call_output", "call_id": "c", "output": out},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Found it."}],
            },
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "go on"},
                    {"type": "input_image", "image_url": "x"},
                ],
            },
        ],
        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}],
    }
    f = feats("responses", body)
    text = (
        len(AGENT_SYSTEM)
        + len("fix the bug")
        + len("read")
        + len('{"p":"a.py"}')
        + len(out)
        + len("Found it.")
        + len("think")
        + len("go on")
    )
    assert text < f.prompt_chars < text + 100
    assert f.images == 1
    assert f.kind == "code"
    assert f.agentic


# --- anthropic messages -------------------------------------------------------------------


def test_messages_system_blocks_tool_use_and_nested_tool_result() -> None:
    body = agent_request(60_000, stream=False)
    f = feats("messages", body)
    assert f.api == "messages"
    assert f.max_tokens == 4096
    assert f.stream is False
    assert f.has_tools
    assert f.kind == "code"
    assert f.agentic
    assert 60_000 <= f.prompt_chars < 60_000 + 20_000  # + the tool schemas
    nested = {
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm"},
                    {
                        "type": "tool_use",
                        "id": "t",
                        "name": "grep",
                        "input": {"pattern": "x" * 100},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [
                            {"type": "text", "text": "y" * 50},
                            {"type": "image", "source": {"data": "Z" * 5000}},
                        ],
                    },
                ],
            },
        ],
    }
    g = feats("messages", nested)
    assert g.prompt_chars == len("You are terse.") + 1 + 3 + 4 + len("pattern") + 100 + 50
    assert g.images == 1


def test_messages_system_string_and_plain_turns_are_prose() -> None:
    body = {
        "system": "You are a kind poet.",
        "messages": [{"role": "user", "content": prose_text(3000)}],
        "max_tokens": 100,
    }
    f = feats("messages", body)
    assert f.kind == "prose"
    assert not f.agentic


# --- content kind -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("What is the capital of France?", "prose"),
        (prose_text(20_000), "prose"),
        ("I want to return the book and import a new one from the store.", "prose"),
        ("Why does this fail?\n```python\nx = foo()\n```\n", "code"),
        (code_text(3000), "code"),
        ("please apply:\n" + DIFF, "code"),
        ("int main(void) { for (int i = 0; i < n; i++) { sum += a[i]; } return 0; }", "code"),
        # a request for code in plain words: the answer will be code
        ("Write a Python function that checks whether a string is a palindrome.", "code"),
        ("Can you implement binary search in JavaScript for me?", "code"),
        ("Write a short poem about autumn rain.", "prose"),
        ("Help me write a polite email asking my landlord to fix the heating.", "prose"),
        ("I will fix dinner. The test of the new oven is tomorrow.", "prose"),
    ],
)
def test_content_kind(text: str, kind: str) -> None:
    assert feats("chat", {"messages": [{"role": "user", "content": text}]}).kind == kind


def test_tool_chat_about_weather_stays_prose() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "What's the weather in Paris today?"},
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "weather", "arguments": '{"city":"Paris"}'}}],
            },
            {"role": "tool", "content": '{"temp_c": 21, "sky": "clear"}'},
        ],
        "tools": [{"type": "function", "function": {"name": "weather"}}],
    }
    f = feats("chat", body)
    assert f.has_tools
    assert f.kind == "prose"
    assert not f.agentic


def test_agent_system_prompt_alone_makes_code() -> None:
    body = {
        "messages": [
            {"role": "system", "content": AGENT_SYSTEM},
            {"role": "user", "content": "Rename the helper please."},
        ]
    }
    f = feats("chat", body)
    assert f.kind == "code"
    assert f.agentic


# --- session key, pin ---------------------------------------------------------------------------


def _conv(system: str, first: str, *later: str) -> dict[str, Any]:
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    for i, text in enumerate(later):
        msgs.append({"role": "assistant" if i % 2 == 0 else "user", "content": text})
    return {"model": "m", "messages": msgs}


def test_session_key_is_stable_across_turns() -> None:
    first = feats("chat", _conv("sys", "hello")).session_key
    later = feats("chat", _conv("sys", "hello", "hi!", "and now?", "sure")).session_key
    assert first is not None
    assert first == later
    assert feats("chat", _conv("sys", "hello there")).session_key != first
    assert feats("chat", _conv("other sys", "hello")).session_key != first
    other_model = dict(_conv("sys", "hello"), model="n")
    assert feats("chat", other_model).session_key != first


def test_session_key_same_for_same_prefix_in_anthropic_agent() -> None:
    a = agent_request(30_000)
    b = agent_request(60_000)  # the same session, further on
    assert feats("messages", a).session_key == feats("messages", b).session_key


def test_session_key_of_huge_first_turn_is_bounded_but_sensitive() -> None:
    big = "x" * 1_000_000
    a = feats("chat", _conv("s", big + "A")).session_key
    b = feats("chat", _conv("s", big + "B")).session_key  # differs in the tail
    c = feats("chat", _conv("s", big[:-1] + "A")).session_key  # differs in length
    assert len({a, b, c}) == 3


def test_session_header_wins_and_pin_is_normalised() -> None:
    f = feats("chat", short_chat(), session="  conv-42 ", pin=" max ")
    assert f.session_key == "conv-42"
    assert f.pinned_profile == "max"
    g = feats("chat", short_chat(), session="", pin="   ")
    assert g.session_key is not None and g.session_key != ""
    assert g.pinned_profile is None


# --- tolerance ----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "completions", "responses", "messages"])
def test_non_object_body_is_a_value_error(api: Api) -> None:
    with pytest.raises(FeatureError):
        feats(api, [1, 2, 3])
    assert issubclass(FeatureError, ValueError)


@pytest.mark.parametrize("api", ["chat", "completions", "responses", "messages"])
def test_wrong_shapes_are_tolerated(api: Api) -> None:
    weird: list[dict[str, Any]] = [
        {},
        {"messages": "nope", "prompt": 3, "input": {"role": 1}, "system": 7},
        {"messages": [1, None, "x", {"role": "user", "content": 5}], "tools": "t"},
        {"messages": [{"role": "user", "content": [None, 3, {"type": 9}, ["deep"]]}]},
        {"messages": [{"role": "assistant", "tool_calls": {"a": 1}}], "max_tokens": True},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": "x"}, 4]}]},
        {"input": [{"type": "function_call", "arguments": {"a": [1, {"b": None}]}}]},
        {"model": 5, "stream": "yes", "max_tokens": -1, "max_output_tokens": 1.5},
    ]
    for body in weird:
        f = feats(api, body)
        assert f.model in ("", "m")
        assert f.stream is False
        assert f.max_tokens is None
        assert f.prompt_chars >= 0


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "role",
                    "content",
                    "type",
                    "text",
                    "input",
                    "output",
                    "arguments",
                    "tool_calls",
                    "function",
                    "messages",
                    "system",
                    "prompt",
                    "name",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(
    api=st.sampled_from(["chat", "completions", "responses", "messages"]),
    body=st.dictionaries(
        st.sampled_from(["messages", "input", "prompt", "system", "instructions", "tools"]),
        _json,
        max_size=4,
    ),
)
def test_fuzzed_bodies_never_raise(api: Api, body: dict[str, Any]) -> None:
    f = feats(api, body)
    assert f.est_prompt_tokens >= 0


def test_deeply_nested_tool_arguments_do_not_recurse_forever() -> None:
    deep: Any = "leaf"
    for _ in range(500):
        deep = {"k": [deep]}
    body = {"messages": [{"role": "user", "content": [{"type": "tool_use", "input": deep}]}]}
    assert feats("messages", body).prompt_chars >= 0


# --- calibration ------------------------------------------------------------------------------


def user(model: str, text: str) -> RequestFeatures:
    return feats("chat", {"model": model, "messages": [{"role": "user", "content": text}]})


def test_calibrator_learns_per_model_ratio() -> None:
    cal = TokenCalibrator(default=3.5, half_life=10)
    assert cal.chars_per_token("m") == 3.5
    f = user("m", "a" * 5000)
    for _ in range(80):
        cal.observe(f, context_tokens=2000 + TEMPLATE_TOKENS_PER_MESSAGE)  # 2.5 chars per token
    assert cal.chars_per_token("m") == pytest.approx(2.5, rel=0.01)
    assert cal.chars_per_token("other") == 3.5


def test_calibrator_ignores_tiny_prompts_and_clamps() -> None:
    cal = TokenCalibrator(default=3.5, half_life=10)
    cal.observe(user("m", "hi"), context_tokens=12)
    assert cal.chars_per_token("m") == 3.5
    huge = user("m", "a" * 100_000)
    for _ in range(500):
        cal.observe(huge, context_tokens=100)  # 1000 chars/token: nonsense, clamped
    assert cal.chars_per_token("m") == pytest.approx(12.0)


def test_one_request_moves_the_shared_ratio_by_at_most_one_percent() -> None:
    cal = TokenCalibrator(default=3.5, half_life=20)
    odd = user("m", "x" * 3000)
    cal.observe(odd, context_tokens=3000)  # 1 char per token: a crafted prompt
    assert cal.chars_per_token("m") == pytest.approx(3.5 / 1.01)
    for _ in range(9):
        cal.observe(odd, context_tokens=3000)
    assert cal.chars_per_token("m") >= 3.5 / 1.01**10 > 3.5 * 0.9  # ten requests: under 10%


def test_template_tokens_of_many_tiny_messages_count_in_the_estimate() -> None:
    """10,000 one-character messages are ~60,000 tokens with their chat template: estimated so
    (it was 2,857), and ten of them move the shared ratio under 10% (it was 3.5 -> 1.59)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}] * 10_000}
    f = feats("chat", body, cpt=3.5)
    assert f.est_prompt_tokens == pytest.approx(60_004, rel=0.15)  # was 2,857
    cal = TokenCalibrator(default=3.5, half_life=20)
    for _ in range(10):
        cal.observe(f, context_tokens=60_004)
    assert cal.chars_per_token("m") >= 3.5 / 1.01**10


def test_calibrator_subtracts_known_parts() -> None:
    cal = TokenCalibrator(default=3.0, half_life=10)
    f = feats(
        "chat",
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a" * 3000},
                        {"type": "image_url", "image_url": {"url": "u"}},
                    ],
                }
            ],
        },
    )
    cal.observe(f, context_tokens=1000 + IMAGE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE)
    assert cal.chars_per_token("m") == pytest.approx(3.0)  # exactly the default: nothing moved


def test_calibrator_json_roundtrip_and_garbage() -> None:
    cal = TokenCalibrator(default=3.5, half_life=10)
    f = feats("chat", {"model": "m", "messages": [{"role": "user", "content": "a" * 4000}]})
    cal.observe(f, context_tokens=1000)
    restored = TokenCalibrator(default=3.5, half_life=10)
    restored.load_json(json.loads(json.dumps(cal.to_json())))
    assert restored.chars_per_token("m") == cal.chars_per_token("m") == pytest.approx(3.5 * 1.01)
    restored.load_json({"x": [999, 1], "y": "bad", "z": [2.0, -1]})
    restored.load_json([1, 2])
    assert restored.chars_per_token("x") == restored.chars_per_token("z") == 3.5


def test_a_prompt_whose_bulk_is_a_fenced_file_is_code_whatever_leads_it_in() -> None:
    """A file given to copy or refactor: a long English lead-in fills the head that the other
    signals sample, but the drafter spends the request inside the fenced file."""
    lead_in = prose_text(2500)
    copy = f"{lead_in}\n\nCopy this file exactly:\n```python\n{code_text(6000)}\n```\n"
    assert feats("chat", {"messages": [{"role": "user", "content": copy}]}).kind == "code"
    # A short fenced snippet in a long prose prompt does not make it code by bulk.
    aside = f"{prose_text(8000)}\n```text\nnote\n```\n{prose_text(2000)}"
    assert fenced_share([aside], 0) < 0.01


def test_the_fenced_share_counts_what_lies_between_fences() -> None:
    assert fenced_share(["ab```cd```"], 0) == pytest.approx(5 / 10)
    assert fenced_share(["lead ```open to the end"], 0) == pytest.approx(18 / 23)
    assert fenced_share(["system ```x```", "plain"], 1) == 0.0  # the system part is not read
    assert fenced_share([], 0) == 0.0


def test_the_agents_own_session_headers_are_session_keys() -> None:
    """X-MTP-Session first, then the agents' own headers in the configured order, case-blind
    (a balancer hashes the same header: docs/operations.md, Several boxes)."""
    from multidict import CIMultiDict

    from proxy.config.routing import RoutingSettings

    routing = RoutingSettings()
    claude = CIMultiDict({"X-Claude-Code-Session-Id": "cc-1"})
    codex = CIMultiDict({"session_id": "codex-1", "User-Agent": "codex"})
    both = CIMultiDict({"x-session-id": "generic", "X-MTP-Session": "mine"})
    blank = CIMultiDict({"X-MTP-Session": "  ", "X-Session-Id": "generic"})
    assert routing.session_of(claude) == "cc-1"
    assert routing.session_of(codex) == "codex-1"
    assert routing.session_of(both) == "mine"
    assert routing.session_of(blank) == "generic"
    assert routing.session_of(CIMultiDict()) is None
    only_ours = RoutingSettings(client_session_headers=[])
    assert only_ours.session_of(claude) is None and only_ours.session_of(both) == "mine"
