"""A chat template's refusal reaches the client as the 400 it is (proxy/compat/template_refusal).

On the Qwen3.5/3.6 template llama-server answers 500 with the Jinja trace when the messages hold
no user query, none at all, or a late system message the proxy could not mend. The simulator's
Qwen presets copy those refusals, measured on the pinned llama-server
(tests/support/template_refusals.py). Relayed as 500s, the openai and anthropic SDKs sent each
such request three times and then reported a server fault.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.support import template_refusals
from tests.support.harness import (
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)

MODEL = "qwen"
PREFIX = "the model's chat template refused these messages: "
GENERATION = ("/v1/chat/completions", "/v1/messages", "/v1/responses")
CASES = [
    (path, body, words, stream)
    for path, body, words in template_refusals.REFUSED
    for stream in ((False, True) if path in GENERATION else (False,))
]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    model = simulator_model(MODEL, preset="setup-b", time_scale=1000.0, draft_control="per-request")
    settings = proxy_config([model], routing={"calibrate": "off"})
    with running_proxy(settings, tmp_path_factory.mktemp("template-refusals")) as running:
        wait_all_ready(running, {MODEL: 1})
        yield running


def post(proxy: ProxyProcess, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    data = json.dumps({**body, "model": MODEL}).encode()
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(proxy.url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def requests_logged(proxy: ProxyProcess, path: str) -> int:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10):
        pass  # a scrape flushes the deferred log lines
    lines = proxy.log_lines()
    return sum(1 for line in lines if line.get("event") == "request" and line["path"] == path)


@pytest.mark.parametrize(("path", "body", "words", "stream"), CASES)
def test_a_template_refusal_is_a_400_in_the_apis_shape(
    proxy: ProxyProcess, path: str, body: dict[str, Any], words: str, stream: bool
) -> None:
    status, answer = post(proxy, path, {**body, "stream": True} if stream else body)
    assert status == 400, answer
    if path.startswith("/v1/messages"):
        assert answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["message"] == PREFIX + words


def test_the_openai_sdk_gets_a_bad_request_and_sends_it_once(proxy: ProxyProcess) -> None:
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="none", timeout=30)
    before = requests_logged(proxy, "/v1/chat/completions")
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": "You review code."}]
        )
    assert raised.value.message.endswith(PREFIX + template_refusals.NO_USER_QUERY)
    assert requests_logged(proxy, "/v1/chat/completions") - before == 1


def test_the_anthropic_sdk_gets_a_bad_request_and_sends_it_once(proxy: ProxyProcess) -> None:
    client = anthropic.Anthropic(base_url=proxy.url, api_key="none", timeout=30)
    before = requests_logged(proxy, "/v1/messages")
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(
            model=MODEL,
            max_tokens=8,
            system="You review code.",
            messages=[{"role": "assistant", "content": "Ready."}],
        )
    body = raised.value.body
    assert isinstance(body, dict)
    assert body["error"]["message"] == PREFIX + template_refusals.NO_USER_QUERY
    assert requests_logged(proxy, "/v1/messages") - before == 1
