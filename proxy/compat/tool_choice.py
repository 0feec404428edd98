"""A chat request's `tool_choice` that names a function, which llama-server does not force.

llama-server reads `tool_choice` as a string ("auto", "none", "required"); an object, OpenAI's
`{"type": "function", "function": {"name": "get_weather"}}`, is the wrong type to it: it logs
"Wrong type supplied for parameter 'tool_choice'" and goes on with "auto", so the model may answer
without calling the function the client forced (checked on b11434). The mend asks for what the
client meant in the words llama-server enforces: "required", with the named function the
request's only tool. A name that is not among the request's tools is refused, as OpenAI does.

The template then renders one tool instead of all of them: such a request shares less of its
prompt with the requests around it (a prefix-cache cost, on that request only).
"""

from __future__ import annotations

from typing import Any

from proxy.compat.outcome import Refused


def mend_named_tool_choice(body: dict[str, Any]) -> dict[str, Any]:
    """The body with a named function choice made "required" of that function alone; the same
    object when there is none. Raises Refused when the name is not among the tools."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return body
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    tools = body.get("tools")
    if not isinstance(name, str) or not isinstance(tools, list):
        return body
    named = [tool for tool in tools if _name_of(tool) == name]
    if not named:
        raise Refused(
            f"tool_choice names the function {name[:100]!r}, which is not among the request's tools"
        )
    return {**body, "tools": named[:1], "tool_choice": "required"}


def _name_of(tool: Any) -> Any:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None
