"""Key comparison in constant time (the keys at work on a running proxy:
tests/proxy/test_security.py)."""

from __future__ import annotations

import time

from proxy.serving.middlewares import key_matches


def test_key_comparison_takes_the_same_time_wherever_the_keys_differ() -> None:
    """`==` stops at the first differing byte; a constant-time compare does not. With 1 MB keys
    the difference is ~1000x for `==`, so a 2x bound needs no quiet machine."""
    key = "k" * 1_000_000
    early = "x" + key[1:]  # differs at the first byte
    late = key[:-1] + "x"  # differs at the last byte

    def timing(presented: str) -> float:
        started = time.perf_counter()
        key_matches(presented.encode(), [key, key])
        return time.perf_counter() - started

    timing(early)  # warm up
    # Interleaved, and the fastest of each: other processes' load only ever adds time, and a
    # busy spell falls on both alike.
    pairs = [(timing(early), timing(late)) for _ in range(25)]
    ratio = min(late for _, late in pairs) / min(early for early, _ in pairs)
    assert 0.5 < ratio < 2.0, f"late/early mismatch time ratio {ratio:.2f}"
    assert key_matches(key.encode(), ["other", key])
    assert not key_matches(late.encode(), [key])
