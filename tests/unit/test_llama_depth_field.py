"""The drafting arithmetic the real-llama-server depth tests count on (those tests:
tests/llama/test_llama_depth_field.py)."""

from __future__ import annotations

from tests.support.llama_fixtures import expected_drafts


def test_expected_drafts_matches_the_recorded_figures() -> None:
    # 60 tokens at depth 1/2/3 drafted 29/39/44 on the pinned build
    # (docs/published-figures.md#per-request-depth).
    assert [expected_drafts(60, d) for d in (0, 1, 2, 3)] == [0, 29, 39, 44]
