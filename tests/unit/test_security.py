"""Key comparison in constant time (the keys at work on a running proxy:
tests/proxy/test_security.py)."""

from __future__ import annotations

import statistics
import time

from proxy.serving.middlewares import key_matches


def test_key_comparison_takes_the_same_time_wherever_the_keys_differ() -> None:
    """`==` stops at the first differing byte; a constant-time compare does not. With 1 MB keys
    the difference is ~1000x for `==`, so a 2x bound needs no quiet machine."""
    key = "k" * 1_000_000
    early = "x" + key[1:]  # differs at the first byte
    late = key[:-1] + "x"  # differs at the last byte

    def timing(presented: str) -> float:
        samples = []
        for _ in range(15):
            started = time.perf_counter()
            key_matches(presented, [key, key])
            samples.append(time.perf_counter() - started)
        return statistics.median(samples)

    timing(early)  # warm up
    ratio = timing(late) / timing(early)
    assert 0.5 < ratio < 2.0, f"late/early mismatch time ratio {ratio:.2f}"
    assert key_matches(key, ["other", key]) and not key_matches(late, [key])
