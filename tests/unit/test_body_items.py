"""proxy.serving.body_items: counting a body's items from its bytes (large bodies, before they
are parsed) says what checking the parsed body says (small ones), whatever strings, escapes and
nesting it holds. Through a real proxy: tests/proxy/test_body_items.py."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.serving.body_items import ItemLimits, TooManyItems, check_parsed, count_items

LIMITS = ItemLimits(messages=3, input_items=3, content_parts=2, tools=2, items=10**9)
# Strings that look like structure: quotes, backslashes and brackets inside them.
TEXTS = st.sampled_from(["", "a", '"', "\\", '\\"', "{", "[", "]}", ",", ":", '"messages": [', "é"])
SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | TEXTS
KEYS = st.sampled_from(["messages", "input", "tools", "content", "role", "x"])
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS | TEXTS, inner, max_size=4),
    max_leaves=24,
)
BODIES = st.dictionaries(KEYS, VALUES, max_size=4)


def verdict(check: object, *args: object) -> str | None:
    try:
        check(*args)  # type: ignore[operator]
    except TooManyItems as exc:
        return str(exc)
    return None


@settings(max_examples=400, deadline=None)
@given(BODIES, st.booleans())
def test_counting_the_bytes_agrees_with_the_parsed_body(
    body: dict[str, object], pretty: bool
) -> None:
    raw = json.dumps(body, indent=1 if pretty else None, ensure_ascii=False).encode()
    from_bytes = verdict(count_items, raw, LIMITS)
    parsed = verdict(check_parsed, body, LIMITS)
    assert (from_bytes is None) == (parsed is None), (raw, from_bytes, parsed)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"messages": [{}, {}, {}, {}]}', "the request has more than 3 messages"),
        (b'{"input": [1, 2, 3, 4]}', "the request has more than 3 input items"),
        (b'{"tools": [{}, {}, {}]}', "the request has more than 2 tools"),
        (b'{"messages": [{}, {"content": [1, 2, 3]}]}', "messages[1] has more than 2 content"),
        (b'{"input": [{"content": ["a", "b", "c"]}]}', "input[0] has more than 2 content parts"),
    ],
)
def test_each_cap_is_named(raw: bytes, message: str) -> None:
    for check, argument in ((count_items, raw), (check_parsed, json.loads(raw))):
        with pytest.raises(TooManyItems, match=message.replace("[", r"\[").replace("]", r"\]")):
            check(argument, LIMITS)  # type: ignore[operator]


def test_what_is_not_counted() -> None:
    within = [
        b'{"x": {"messages": [1, 2, 3, 4, 5]}}',  # not at the top level
        b'{"messages": "[{}, {}, {}, {}, {}]"}',  # a string
        b'{"messages": [{"role": "user", "content": "a, b, c, d"}]}',  # commas in a string
        b'{"messages": [{"x": "\\"", "content": [1, 2]}]}',  # an escaped quote before them
        b'{"tools": [[1, 2, 3], [4, 5, 6]]}',  # an array in an item is not one more tool
    ]
    for raw in within:
        count_items(raw, LIMITS)
        check_parsed(json.loads(raw), LIMITS)


def test_items_in_all_are_counted_from_the_bytes() -> None:
    small = ItemLimits(messages=10, input_items=10, content_parts=10, tools=10, items=5)
    count_items(b'{"a": [1, 2], "b": "x,y,z,w"}', small)  # 4: the object, the array, 2 commas
    with pytest.raises(TooManyItems, match="more than 5 JSON items"):
        count_items(b'{"a": [1, 2, 3, 4, 5]}', small)


def test_bytes_that_are_no_json_are_left_to_the_parser() -> None:
    for raw in (b"]]]", b'{"messages": [', b'"open string', b"\xff\xfe{", b""):
        count_items(raw, LIMITS)
