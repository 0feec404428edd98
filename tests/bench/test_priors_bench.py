"""bench/priors.py, bounded: a proxy started from another's export reaches that one's per-class
choices in fewer requests than one started cold, and the merge of many exports is timed. The
figures themselves: docs/benchmarks.md."""

from __future__ import annotations

import json

import pytest

from bench import priors


def test_a_box_from_priors_reaches_the_first_ones_choices_sooner(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert priors.main(["--requests", "40", "--exports", "20", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["target"]) == {"code", "prose"}
    assert result["from_priors"] < result["cold"]
    assert result["from_priors"] <= 2 * 2 * result["streak"]  # at most a second streak's worth
    assert result["merge_s"] > 0 and result["merged_bytes"] > 0
