"""The per-request depth spliced into a client's body: the key first, nothing else changed."""

from __future__ import annotations

import json

import pytest

from proxy.apis import DEPTH_KEY
from proxy.serving.depth_field import with_depth

BODIES = [
    b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
    b'  \n{ "stream" : true , "prompt": "caf\xc3\xa9 {}" }  ',
    b"{}",
    b"{ \n }",
    b'{"nested":{"speculative":{"n_max":9}}}',
]


@pytest.mark.parametrize("raw", BODIES)
def test_the_depth_is_the_first_key_and_the_rest_is_the_clients(raw: bytes) -> None:
    out = with_depth(raw, 2)
    parsed = json.loads(out)
    assert next(iter(parsed)) == DEPTH_KEY and parsed[DEPTH_KEY] == 2
    del parsed[DEPTH_KEY]
    assert parsed == json.loads(raw)
    # Only the key was added: the client's bytes follow unchanged.
    assert raw.strip()[1:] in out


def test_zero_means_no_drafting_and_is_written_as_such() -> None:
    assert with_depth(b'{"a":1}', 0) == b'{"speculative.n_max":0,"a":1}'
