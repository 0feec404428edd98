"""The Responses mends (proxy/compat: input_items, text_format, codex_tools) on the bodies real
clients sent (tests/fixtures/compat: opencode's @ai-sdk/openai second turns, Codex 0.171.0 with
its default model name) and on answers shaped as llama-server's (tools/server/server-task.cpp of
the pinned build)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.compat.codex_tools import (
    CodexToolEvents,
    has_additional_tools,
    mend_additional_tools,
    rewritten_body,
    tool_map,
)
from proxy.compat.input_items import mend_input_items
from proxy.compat.outcome import Refused
from proxy.compat.request import Chained
from proxy.compat.text_format import mend_text_format
from proxy.serving.responses_events import ResponsesEventIndexer
from simulator.prompts import BadRequest, responses_prompt

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compat"


def fixture(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text("utf-8"))
    return body


def accepted(body: dict[str, Any]) -> bool:
    """Whether llama-server's Responses converter takes the input (as the simulator models it)."""
    try:
        responses_prompt(body)
    except BadRequest:
        return False
    return True


# --- items without a type, reasoning without content ----------------------------------------------


def test_an_ai_sdk_second_turn_gets_its_assistant_item_typed() -> None:
    body = fixture("opencode-responses-turn2.json")
    untyped = [x for x in body["input"] if "type" not in x]
    assert any(x["role"] == "assistant" for x in untyped) and not accepted(body)
    mended = mend_input_items(body)
    assert accepted(mended)
    for before, after in zip(body["input"], mended["input"], strict=True):
        assert after == ({**before, "type": "message"} if "type" not in before else before)


def test_a_reasoning_item_without_content_is_dropped() -> None:
    body = fixture("opencode-responses-turn2-reasoning.json")
    reasoning = [x for x in body["input"] if x.get("type") == "reasoning"]
    assert reasoning == [{"type": "reasoning", "encrypted_content": "", "summary": []}]
    assert not accepted(body)
    mended = mend_input_items(body)
    assert accepted(mended)
    assert [x for x in mended["input"] if x.get("type") == "reasoning"] == []
    assert len(mended["input"]) == len(body["input"]) - 1


def test_a_reasoning_item_with_text_stays() -> None:
    item = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "t"}],
    }
    body = {"input": [{"type": "message", "role": "user", "content": "hi"}, item]}
    assert mend_input_items(body) is body


def test_typed_items_are_the_same_object() -> None:
    body = fixture("codex-named-model.json")
    assert mend_input_items(body) is body


# --- text.format -> response_format ---------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


def test_json_schema_becomes_the_top_level_response_format() -> None:
    fmt = {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}
    body = {"input": "2+2?", "text": {"format": fmt, "verbosity": "low"}}
    mended = mend_text_format(body)
    assert mended["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
    }
    assert mended["text"] == body["text"] and "response_format" not in body


def test_json_object_becomes_json_object() -> None:
    body = {"input": "hi", "text": {"format": {"type": "json_object"}}}
    assert mend_text_format(body)["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(
    "body",
    [
        {"input": "hi"},
        {"input": "hi", "text": {"verbosity": "low"}},  # Codex's default model
        {"input": "hi", "text": {"format": {"type": "text"}}},
        {"input": "hi", "text": {"format": {"type": "json_object"}}, "response_format": {}},
    ],
)
def test_nothing_to_enforce_is_the_same_object(body: dict[str, Any]) -> None:
    assert mend_text_format(body) is body


def test_a_json_schema_without_a_schema_is_refused() -> None:
    with pytest.raises(Refused, match=r"text\.format"):
        mend_text_format({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}})


# --- Codex's additional_tools ---------------------------------------------------------------------


def test_codex_default_model_tools_join_the_request_tools() -> None:
    body = fixture("codex-default-model.json")
    assert has_additional_tools(body) and "tools" not in body and not accepted(body)
    mended = mend_additional_tools(body)
    assert not has_additional_tools(mended)
    names = [t["name"] for t in mended["tools"]]
    assert names == [
        "exec",
        "wait",
        "request_user_input",
        "request_user_input_async",
        "send_message_to_user_async",
        "sleep",
        "followup_task",
        "interrupt_agent",
        "list_agents",
        "send_message",
        "spawn_agent",
        "wait_agent",
    ]
    assert all(t["type"] == "function" for t in mended["tools"])
    exec_tool = mended["tools"][0]
    assert exec_tool["parameters"]["required"] == ["input"]
    assert "format" not in exec_tool  # the Lark grammar: llama-server has no free-form tools
    assert accepted(mended)
    assert mended["input"] == body["input"][1:]


def test_custom_tool_history_becomes_function_calls() -> None:
    body = fixture("codex-default-model-custom-call.json")
    call, output = body["input"][-2:]
    assert (call["type"], output["type"]) == ("custom_tool_call", "custom_tool_call_output")
    mended = mend_additional_tools(body)
    assert accepted(mended)
    assert mended["input"][-2:] == [
        {
            "type": "function_call",
            "call_id": call["call_id"],
            "name": "exec",
            "arguments": json.dumps({"input": call["input"]}),
        },
        {"type": "function_call_output", "call_id": call["call_id"], "output": output["output"]},
    ]


def test_a_name_already_in_tools_keeps_the_first() -> None:
    body = fixture("codex-default-model.json")
    body["tools"] = [{"type": "function", "name": "sleep", "parameters": {}}]
    names = [t["name"] for t in mend_additional_tools(body)["tools"]]
    assert names.count("sleep") == 1 and names[0] == "sleep"


def test_odd_shapes_around_them_do_not_break_the_mend() -> None:
    body = fixture("codex-default-model.json")
    body["tools"] = [{"type": "function", "name": ["not", "a", "name"]}, "not a tool"]
    body["input"].insert(1, {"type": "additional_tools", "tools": [{"type": "namespace"}, 7]})
    mended = mend_additional_tools(body)
    assert mended["tools"][:2] == body["tools"] and len(mended["tools"]) == 14
    odd = sse(
        "response.function_call_arguments.delta",
        {"type": "response.function_call_arguments.delta", "item_id": [1]},
    )
    assert CodexToolEvents(tool_map(body)).feed(odd) == odd


def test_a_request_without_them_is_the_same_object() -> None:
    body = fixture("codex-named-model.json")
    assert mend_additional_tools(body) is body
    assert not tool_map(body)


def test_the_tool_map_knows_custom_and_namespaced_tools() -> None:
    tools = tool_map(fixture("codex-default-model.json"))
    assert tools.custom == {"exec"}
    assert tools.namespaces["sleep"] == "clock"
    assert tools.namespaces["spawn_agent"] == "collaboration"
    assert "wait" not in tools.namespaces  # the default namespace, "functions"


def test_the_client_body_is_never_changed() -> None:
    body = fixture("codex-default-model-custom-call.json")
    kept = copy.deepcopy(body)
    mend_additional_tools(body)
    mend_input_items(body)
    mend_text_format(body)
    assert body == kept


# --- the answer, as llama-server writes it --------------------------------------------------------


def function_call(
    name: str, arguments: dict[str, Any], status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": "fc_abc",
        "type": "function_call",
        "status": status,
        "arguments": json.dumps(arguments),
        "call_id": "call_abc",
        "name": name,
    }


def test_a_complete_answer_calls_custom_and_namespaced_tools_as_codex_expects() -> None:
    tools = tool_map(fixture("codex-default-model.json"))
    answer = {
        "id": "resp_1",
        "object": "response",
        "output": [
            function_call("exec", {"input": "text('hi')"}),
            function_call("sleep", {"duration_ms": 10}),
            function_call("wait", {"seconds": 1}),
        ],
    }
    out = orjson.loads(rewritten_body(orjson.dumps(answer), tools))["output"]
    assert out[0] == {
        "id": "fc_abc",
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": "call_abc",
        "name": "exec",
        "input": "text('hi')",
    }
    assert out[1] == {**answer["output"][1], "namespace": "clock"}
    assert out[2] == answer["output"][2]


def test_an_answer_without_such_calls_keeps_its_bytes() -> None:
    tools = tool_map(fixture("codex-default-model.json"))
    raw = orjson.dumps({"output": [{"type": "message", "content": []}]})
    assert rewritten_body(raw, tools) is raw


def sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def stream_of_a_call(name: str, arguments: dict[str, Any]) -> list[bytes]:
    """llama-server's stream of one function call (server-task.cpp): added, argument deltas,
    done, completed."""
    text = json.dumps(arguments)
    added = {**function_call(name, {}, "in_progress"), "arguments": ""}
    done = function_call(name, arguments)
    return [
        sse("response.created", {"type": "response.created", "response": {"id": "r"}}),
        sse("response.output_item.added", {"type": "response.output_item.added", "item": added}),
        *(
            sse(
                "response.function_call_arguments.delta",
                {
                    "type": "response.function_call_arguments.delta",
                    "delta": part,
                    "item_id": "fc_abc",
                },
            )
            for part in (text[:7], text[7:])
        ),
        sse("response.output_item.done", {"type": "response.output_item.done", "item": done}),
        sse(
            "response.completed",
            {"type": "response.completed", "response": {"id": "r", "output": [done]}},
        ),
    ]


def events(stream: bytes) -> list[dict[str, Any]]:
    out = []
    for event in stream.split(b"\n\n"):
        if event:
            out.append(orjson.loads(event[event.index(b"data: ") + 6 :]))
    return out


@pytest.mark.parametrize("cut", [1, 17, 1000])
def test_a_streamed_custom_call_reaches_codex_as_a_custom_tool_call(cut: int) -> None:
    tools = tool_map(fixture("codex-default-model.json"))
    whole = b"".join(stream_of_a_call("exec", {"input": "text('hi')"}))
    rewriter = Chained(CodexToolEvents(tools), ResponsesEventIndexer("gpt-6.2-sol"))
    out = b"".join(rewriter.feed(whole[i : i + cut]) for i in range(0, len(whole), cut))
    out += rewriter.flush()
    got = events(out)
    kinds = [e["type"] for e in got]
    assert kinds == [
        "response.created",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]  # the argument deltas of a JSON object Codex never sees are held back
    assert got[1]["item"]["type"] == "custom_tool_call" and got[1]["item"]["input"] == ""
    assert got[2]["item"]["input"] == "text('hi')"
    assert got[3]["response"]["output"][0]["type"] == "custom_tool_call"
    assert [e["sequence_number"] for e in got] == [0, 1, 2, 3]


def test_a_streamed_namespaced_call_carries_its_namespace() -> None:
    tools = tool_map(fixture("codex-default-model.json"))
    rewriter = CodexToolEvents(tools)
    got = events(b"".join(rewriter.feed(e) for e in stream_of_a_call("sleep", {"duration_ms": 1})))
    assert [e.get("item", {}).get("namespace") for e in got[1:5]] == ["clock", None, None, "clock"]
    assert [e["type"] for e in got].count("response.function_call_arguments.delta") == 2
    assert got[5]["response"]["output"][0]["namespace"] == "clock"


def test_text_events_pass_as_they_are() -> None:
    tools = tool_map(fixture("codex-default-model.json"))
    delta = sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": "x"})
    assert CodexToolEvents(tools).feed(delta) == delta
