"""Request bodies bounded by their items, on a real proxy: past a cap on messages, input items,
content parts of a message, tools or JSON items in all, a 413 in the called API's own shape that
names the cap and its setting, both for a small body (parsed, then its arrays' lengths checked)
and a large one (counted from its bytes, off the event loop, before it is parsed); a large
body within the caps is served; forwarded routes are held to the same caps.

The default caps are used (server.max_*): what a body must hold to pass one says they are
generous. The time and memory such bodies cost the proxy: bench/abuse_items.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.config.settings import ServerSettings
from proxy.serving.body_items import SCAN_BYTES
from tests.support.harness import ProxyProcess, proxy_config, running_proxy, wait_all_ready
from tests.support.misbehaving_backend import running_backend

DEFAULTS = ServerSettings()
PAD = "x" * SCAN_BYTES  # a string that makes a body large without items


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with running_backend("echo-body") as echo_url:
        profiles = [{"name": "off", "url": echo_url}]
        model = {"name": "echo", "backend": "simulator", "profiles": profiles}
        with running_proxy(proxy_config([model]), tmp_path_factory.mktemp("items")) as running:
            wait_all_ready(running, {"echo": 1})
            yield running


def post(proxy: ProxyProcess, path: str, body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(
        proxy.url + path, data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def empties(n: int) -> str:
    return "[" + ",".join(["{}"] * n) + "]"


def body(large: bool, **parts: str) -> bytes:
    """A body of the JSON texts given, plus a long string field when ``large``."""
    fields = ['"model": "echo"', '"max_tokens": 4', *(f'"{k}": {v}' for k, v in parts.items())]
    if large:
        fields.append(f'"metadata": {{"pad": "{PAD}"}}')
    return ("{" + ", ".join(fields) + "}").encode()


def message_parts(n: int) -> str:
    user = json.dumps({"role": "user", "content": "hi"})
    parts = "[" + ",".join(['{"type": "text", "text": "a"}'] * n) + "]"
    return f'[{user}, {user}, {{"role": "user", "content": {parts}}}]'


CAPS = {
    "messages": (
        "/v1/chat/completions",
        {"messages": empties(DEFAULTS.max_messages + 1)},
        f"the request has more than {DEFAULTS.max_messages} messages, the most this proxy "
        "accepts (server.max_messages)",
    ),
    "anthropic messages": (
        "/v1/messages",
        {"messages": empties(DEFAULTS.max_messages + 1)},
        f"the request has more than {DEFAULTS.max_messages} messages, the most this proxy "
        "accepts (server.max_messages)",
    ),
    "input items": (
        "/v1/responses",
        {"input": empties(DEFAULTS.max_input_items + 1)},
        f"the request has more than {DEFAULTS.max_input_items} input items, the most this "
        "proxy accepts (server.max_input_items)",
    ),
    "content parts": (
        "/v1/chat/completions",
        {"messages": message_parts(DEFAULTS.max_content_parts + 1)},
        f"messages[2] has more than {DEFAULTS.max_content_parts} content parts, the most this "
        "proxy accepts (server.max_content_parts)",
    ),
    "tools": (
        "/v1/chat/completions",
        {"messages": message_parts(1), "tools": empties(DEFAULTS.max_tools + 1)},
        f"the request has more than {DEFAULTS.max_tools} tools, the most this proxy accepts "
        "(server.max_tools)",
    ),
}


@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
@pytest.mark.parametrize("case", sorted(CAPS))
def test_a_body_over_a_cap_is_413_naming_it(proxy: ProxyProcess, case: str, large: bool) -> None:
    path, parts, message = CAPS[case]
    status, error = post(proxy, path, body(large, **parts))
    assert status == 413, error
    if path == "/v1/messages":
        assert error == {
            "type": "error",
            "error": {"type": "request_too_large", "message": message},
        }
    else:
        assert (error["error"]["type"], error["error"]["message"]) == (
            "invalid_request_error",
            message,
        )


def test_a_large_body_of_too_many_items_in_all_is_413(proxy: ProxyProcess) -> None:
    numbers = "[" + ",".join(["1"] * DEFAULTS.max_body_items) + "]"
    status, error = post(proxy, "/v1/chat/completions", body(False, logit_bias=numbers))
    assert status == 413
    assert error["error"]["message"] == (
        f"the request has more than {DEFAULTS.max_body_items} JSON items, the most this proxy "
        "accepts (server.max_body_items)"
    )


def test_a_large_body_within_the_caps_is_served(proxy: ProxyProcess) -> None:
    messages = json.dumps([{"role": "user", "content": f"part {i}"} for i in range(1000)])
    status, answer = post(proxy, "/v1/chat/completions", body(True, messages=messages))
    assert status == 200, answer
    received = json.loads(answer["choices"][0]["message"]["content"])
    assert len(received["messages"]) == 1000 and received["metadata"]["pad"] == PAD


@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
def test_a_large_body_that_is_not_json_is_400(proxy: ProxyProcess, large: bool) -> None:
    status, error = post(proxy, "/v1/chat/completions", body(large)[:-1])
    assert status == 400
    assert error["error"]["message"].startswith("request body is not valid JSON: ")


@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
@pytest.mark.parametrize("path", ["/v1/messages/count_tokens", "/tokenize"])
def test_forwarded_routes_are_held_to_the_caps(proxy: ProxyProcess, path: str, large: bool) -> None:
    status, error = post(proxy, path, body(large, messages=empties(DEFAULTS.max_messages + 1)))
    assert status == 413
    message = error["error"]["message"]
    assert message.endswith("(server.max_messages)"), error
