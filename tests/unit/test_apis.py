"""The wire contract in one place (proxy.apis): paths, error dialects, the depth key."""

from __future__ import annotations

import pytest

from proxy.apis import API_OF_PATH, DEPTH_KEY, dialect_of, dialect_of_path
from simulator.depth import DEPTH_KEY as SIMULATOR_DEPTH_KEY


@pytest.mark.parametrize(("path", "api"), sorted(API_OF_PATH.items()))
def test_a_generation_path_and_its_api_answer_errors_in_one_dialect(path: str, api: str) -> None:
    # The middlewares answer by path (401, 404, 405), the handlers by API: never two shapes.
    assert dialect_of_path(path) == dialect_of(api)
    assert dialect_of_path(path + "/") == dialect_of(api)


def test_only_messages_and_its_token_counter_speak_anthropic() -> None:
    assert dialect_of("messages") == "anthropic"
    assert dialect_of_path("/v1/messages/count_tokens") == "anthropic"
    assert dialect_of_path("/v1/messages/") == "anthropic"
    for path in ("/v1/responses/input_tokens", "/tokenize", "/admin/backends", "/nowhere"):
        assert dialect_of_path(path) == "openai", path
    assert {dialect_of(api) for api in API_OF_PATH.values() if api != "messages"} == {"openai"}


def test_the_simulator_reads_the_depth_key_the_proxy_writes() -> None:
    assert DEPTH_KEY == SIMULATOR_DEPTH_KEY == "speculative.n_max"
