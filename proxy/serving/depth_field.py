"""The per-request draft depth, written into a client's body on its way to a backend.

The contract (patches/llama.cpp/README.md): the flat top-level key ``"speculative.n_max"``, an
integer; 0 = no drafting for this request. The proxy otherwise forwards the client's bytes
unchanged, so the key is spliced in as the object's first member rather than re-serializing the
body: one copy of the bytes, no parse. A client that set the key itself keeps its own value (the
caller skips the splice; a later duplicate key would win in llama-server's parser anyway).
"""

from __future__ import annotations

import re

from proxy.apis import DEPTH_KEY

_PREFIX = b'{"' + DEPTH_KEY.encode() + b'":'
_EMPTY_REST = re.compile(rb"[ \t\r\n]*}")


def with_depth(raw: bytes, depth: int) -> bytes:
    """``raw`` (a JSON object, already validated) with the depth as its first member."""
    return _with_first(raw, _PREFIX, depth)


def with_integer(raw: bytes, key: str, value: int) -> bytes:
    """``raw`` with another integer member first (``id_slot``: proxy.serving.side_requests)."""
    return _with_first(raw, b'{"' + key.encode() + b'":', value)


def _with_first(raw: bytes, prefix: bytes, value: int) -> bytes:
    start = raw.index(b"{")  # only whitespace may precede it in a valid JSON object
    separator = b"" if _EMPTY_REST.match(raw, start + 1) else b","
    # One allocation, the size of the body: slices of a large body would each copy it again.
    rest = memoryview(raw)[start + 1 :]
    return b"".join((raw[:start], prefix, str(int(value)).encode(), separator, rest))
