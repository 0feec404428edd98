"""What a request asks of the answer's form, as llama-server (b11434) reads it: `n`, `logprobs`,
`response_format` and `tool_choice`, refused in its words where it refuses them, and the answer
it then forces.

- `n` (llama-server's `n_cmpl`): an integer from 1 to the server's slots (-np); outside, 400
  "Field 'n': Value must be between 1 <= value <= 4, but got 0". /v1/messages drops it. Several
  completions are served without `stream` on /v1/chat/completions and /v1/completions (one slot
  each); a stream of several, or several on another route (llama-server answers several
  Responses as a JSON array of them), the simulator refuses, saying so: it does not model them.
- `logprobs`: chat takes `logprobs: true` and `top_logprobs` (default 20; alone, a 400);
  /v1/completions takes `logprobs: N` (true: 1). Each generated token then carries
  `{"id", "token", "bytes", "logprob", "top_logprobs"}`, the top ones in the same shape without
  their own list (``token_logprobs``).
- `response_format` `json_object` (any object, or its `schema`) and `json_schema`
  (`json_schema.schema`): the answer is JSON that validates against it (``instance``), as
  llama-server's grammar makes it; another type than text is a 400.
- `tool_choice`: "auto", "none" or "required", another string a 400 "Invalid tool_choice: X";
  an object (a named function) is read as "auto", as llama-server does (a warning in its log).
  "required" with tools: the answer is a call of the first tool, its arguments an instance of
  its parameters' schema.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from typing import Any

from simulator.prompts import BadRequest

_SEVERAL_APIS = ("chat", "completion")  # simulator.formats.Api's values
_DEFAULT_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class Forced:
    """An answer whose form the request fixes: `text` is its content, or the arguments of a
    call of `tool` when one is named."""

    text: str
    tool: str | None = None


def completions_wanted(body: dict[str, Any], api: str, slots: int) -> int:
    """How many completions the request asks for (`n`), or BadRequest in llama-server's words."""
    value = body.get("n")
    if api == "messages" or value is None:
        return 1
    if not isinstance(value, int | float):  # a bool is a number to it, a float is cut
        kinds: dict[type, str] = {str: "string", list: "array", dict: "object"}
        kind = kinds.get(type(value), "null")
        raise BadRequest(
            f"Field 'n': [json.exception.type_error.302] type must be number, but is {kind}"
        )
    value = int(value)
    if not 1 <= value <= slots:
        raise BadRequest(f"Field 'n': Value must be between 1 <= value <= {slots}, but got {value}")
    if value > 1 and (body.get("stream") or api not in _SEVERAL_APIS):
        raise BadRequest(
            "the simulator serves n > 1 only without stream, on /v1/chat/completions and "
            "/v1/completions "
            "(llama-server interleaves several streams, and answers several Responses as a "
            "JSON array)"
        )
    return value


def top_logprobs_wanted(body: dict[str, Any], api: str) -> int:
    """How many top tokens each generated token's logprobs list (0: no logprobs)."""
    if api == "completion":
        value = body.get("logprobs", body.get("n_probs"))
        return int(value) if isinstance(value, int | bool) and value > 0 else 0
    if api != "chat":
        return 0
    if body.get("logprobs") is not True:  # llama-server reads it as a bool, or not at all
        if body.get("top_logprobs") is not None:
            raise BadRequest("top_logprobs requires logprobs to be set to true")
        return 0
    if body.get("tools") and body.get("stream"):
        raise BadRequest("logprobs is not supported with tools + stream")
    top = body.get("top_logprobs")
    return top if isinstance(top, int) and not isinstance(top, bool) else _DEFAULT_TOP_LOGPROBS


def forced_output(body: dict[str, Any], api: str) -> Forced | None:
    """The answer the request's response_format or tool_choice forces (BadRequest where
    llama-server refuses them); None: a free answer."""
    if api not in ("chat", "responses"):
        return None
    call = _forced_call(body) if api == "chat" else None
    if call is not None:
        return call
    schema = _response_schema(body.get("response_format"))
    return None if schema is None else Forced(json.dumps(_instance_or_object(schema)))


def _instance_or_object(schema: dict[str, Any]) -> Any:
    """An instance of ``schema``; an empty object where the schema is not one (llama-server
    would refuse it: the simulator does not model its schema compiler's words)."""
    try:
        return instance(schema, schema)
    except (TypeError, ValueError, AttributeError, KeyError):
        return {}


def _forced_call(body: dict[str, Any]) -> Forced | None:
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        raise BadRequest(f"Invalid tool_choice: {choice}")
    tools = body.get("tools")
    listed = tools if isinstance(tools, list) else []  # another type: none (llama-server: 500)
    functions: list[dict[str, Any]] = [
        t["function"] for t in listed if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]
    if choice != "required" or not functions:
        return None  # a named function (an object) is read as "auto", as llama-server does
    parameters = functions[0].get("parameters")
    schema = parameters if isinstance(parameters, dict) and parameters else {"type": "object"}
    return Forced(json.dumps(_instance_or_object(schema)), str(functions[0].get("name", "")))


def _response_schema(response_format: Any) -> dict[str, Any] | None:
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    kind = kind if isinstance(kind, str) else ""  # another type is read as none at all
    if kind == "json_object":
        schema = response_format.get("schema")
    elif kind == "json_schema":
        wrapper = response_format.get("json_schema")
        schema = wrapper.get("schema") if isinstance(wrapper, dict) else None
    elif kind in ("", "text"):
        return None
    else:
        raise BadRequest(
            f'response_format type must be one of "text" or "json_object", but got: {kind}'
        )
    return schema if isinstance(schema, dict) and schema else {"type": "object"}


def instance(schema: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """A small value that validates against ``schema`` (a JSON Schema as pydantic and clients
    write them: $ref into $defs, anyOf, enum, const, objects, arrays, scalars and their
    bounds)."""
    if not isinstance(schema, dict) or depth > 16:
        return None
    chosen = _chosen_schema(schema, root)
    if chosen is not None:
        return instance(chosen, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    return _of_type(kind, schema, root, depth)


def _chosen_schema(schema: dict[str, Any], root: dict[str, Any]) -> Any:
    """The schema that decides instead of ``schema``: its $ref, its first option, its parts
    merged; None when it decides itself."""
    if "$ref" in schema:
        return _resolve(schema["$ref"], root)
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return schema[key][0]
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged |= _resolve(part["$ref"], root) if "$ref" in part else part
        return merged
    return None


def _of_type(kind: str, schema: dict[str, Any], root: dict[str, Any], depth: int) -> Any:
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: instance(sub, root, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 0)
        items = schema.get("items") or {"type": "string"}
        return [instance(items, root, depth + 1) for _ in range(min(count, 8))]
    if kind in ("integer", "number"):
        return _number(schema)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = "simulated"
    least, most = int(schema.get("minLength", 0)), schema.get("maxLength")
    text = text.ljust(least, "x")
    return text[: int(most)] if most is not None else text


def _number(schema: dict[str, Any]) -> int:
    value = 1
    if "minimum" in schema:
        value = max(value, math.ceil(schema["minimum"]))
    if "exclusiveMinimum" in schema:
        value = max(value, math.floor(schema["exclusiveMinimum"]) + 1)
    if "maximum" in schema:
        value = min(value, math.floor(schema["maximum"]))
    if "exclusiveMaximum" in schema:
        value = min(value, math.ceil(schema["exclusiveMaximum"]) - 1)
    return value


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node


def token_logprobs(
    texts: list[str], ids: list[int], alternatives: list[tuple[int, str]], top: int
) -> list[dict[str, Any]]:
    """llama-server's per-token logprobs of a generated answer: the token itself, a logprob
    (the simulator's, deterministic per token), and the `top` likeliest tokens, the generated
    one first (greedy), the others from ``alternatives``, less likely."""
    entries = []
    for position, (text, tid) in enumerate(zip(texts, ids, strict=True)):
        logprob = -((zlib.crc32(f"{tid}:{position}".encode()) % 2000) / 1000.0) - 0.01
        chosen = _entry(tid, text, logprob)
        others = [
            _entry(other_id, other_text, logprob - 0.5 * (n + 1))
            for n, (other_id, other_text) in enumerate(a for a in alternatives if a[0] != tid)
        ][: max(top - 1, 0)]
        entries.append({**chosen, "top_logprobs": [chosen, *others][:top]})
    return entries


def _entry(tid: int, text: str, logprob: float) -> dict[str, Any]:
    return {"id": tid, "token": text, "bytes": list(text.encode()), "logprob": logprob}
