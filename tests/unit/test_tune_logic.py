"""The pure parts of tune: the grid syntax, the spread rule, the smallest set of profiles."""

from __future__ import annotations

import pytest

from proxy.config.routing import RoutingSettings
from proxy.tune.plan.grid import OFF, DraftSetting, GridError, default_grid, parse_grid
from proxy.tune.plan.workload import builtin_workload, context_targets
from proxy.tune.report.analysis import Cell, Spread, Table
from proxy.tune.report.recommend import recommend

N1, N2, N3 = DraftSetting(1), DraftSetting(2), DraftSetting(3)
N2M1 = DraftSetting(2, 1)


def test_grid_syntax() -> None:
    grid = parse_grid("off, 1, 2/1, 3@0.5, 2/1")
    assert [s.name for s in grid] == ["off", "n1", "n2-m1", "n3-p0.5"]
    assert grid[3].profile_fields() == {
        "spec_type": "draft-mtp", "draft_n_max": 3, "draft_p_min": 0.5,
    }  # fmt: skip
    assert OFF.profile_fields() == {}
    for bad in ("", "2/3", "0", "3@1.5", "max", "2/-1"):
        with pytest.raises(GridError):
            parse_grid(bad)


def test_default_grid() -> None:
    grid = default_grid()
    assert grid[0] == OFF and len(grid) == len(set(grid)) == 16
    spec = [s for s in grid if not s.is_off]
    assert {s.n_max for s in spec} == {1, 2, 3, 4}
    assert all((s.n_min or 0) <= min(2, s.n_max or 0) for s in spec)
    assert {(s.n_max, s.p_min) for s in spec if s.p_min is not None} == {
        (2, 0.5), (2, 0.9), (3, 0.5), (3, 0.9),
    }  # fmt: skip


def test_the_default_grid_is_as_deep_as_the_type() -> None:
    # n-gram types and draft models: a verify step is dear, their gain moves with the depth's
    # order (docs/benchmarks.md): off and doublings up to 16; ngram-cache drafts at most 8.
    for spec_type in ("ngram-mod", "ngram-simple", "draft-simple", "draft-eagle3"):
        grid = default_grid(spec_type)
        assert [s.n_max for s in grid] == [None, 2, 4, 8, 16], spec_type
        assert {s.spec_type for s in grid if not s.is_off} == {spec_type}
    assert [s.n_max for s in default_grid("ngram-cache")] == [None, 2, 4, 8]
    # MTP, and what the table does not know (a list of types, a newer type): MTP's shallow grid.
    for spec_type in ("draft-mtp", "ngram-mod,draft-mtp", "draft-future"):
        assert max(s.n_max or 0 for s in default_grid(spec_type)) == 4, spec_type
        assert len(default_grid(spec_type)) == 16


def test_built_in_workload_has_one_length_per_bucket_that_fits() -> None:
    buckets = RoutingSettings().context_buckets
    assert context_targets(100_000, buckets, 512) == [2048, 8192, 23170, 46340, 81920]
    assert context_targets(8192, buckets, 512) == [2048, 6656]
    items = builtin_workload(8192, buckets, "m").items
    assert [i.id for i in items] == [
        "greeting", "python-game", "code-2048", "prose-2048", "code-6656", "prose-6656",
    ]  # fmt: skip


def _cell(setting: DraftSetting, label: str, lo: float, hi: float, repeats: int = 3) -> Cell:
    mid = (lo + hi) / 2
    return Cell(
        setting=setting,
        label=label,
        repeats=repeats,
        requests=repeats,
        tok_s=Spread(mid, lo, hi),
        acceptance=None,
        prefill_s=None,
        goodput=None,
        speedup=Spread(mid / 40.0, lo / 40.0, hi / 40.0),
        mode="per-process",
    )


def test_better_only_outside_the_spread_and_never_on_one_repeat() -> None:
    assert _cell(N3, "c", 50, 52).better_than(_cell(OFF, "c", 40, 49))
    assert not _cell(N3, "c", 50, 52).better_than(_cell(OFF, "c", 40, 50.5))
    assert not _cell(N3, "c", 60, 60, 1).better_than(_cell(OFF, "c", 40, 40, 1))


def test_fewest_profiles_that_capture_the_gain() -> None:
    table = Table(
        cells=[
            # short: n3 fastest, n2/1 within its spread; mid: n2/1 fastest alone; long: off.
            _cell(OFF, "<4k/prose", 39, 40),
            _cell(N1, "<4k/prose", 45, 47),
            _cell(N2M1, "<4k/prose", 60, 66),
            _cell(N3, "<4k/prose", 64, 68),
            _cell(OFF, "16k-32k/code", 35, 36),
            _cell(N2M1, "16k-32k/code", 45, 46),
            _cell(N3, "16k-32k/code", 40, 42),
            _cell(N1, "16k-32k/code", 36, 37),
            _cell(OFF, "64k+/code", 29, 30),
            _cell(N3, "64k+/code", 25, 29.5),
        ]
    )
    rec = recommend(table)
    # n2/1 alone covers both classes that need speculation: one profile, not two; its name
    # says its setting, and it plays the max role.
    assert [(p.name, p.setting) for p in rec.profiles] == [("off", OFF), ("n2-m1", N2M1)]
    assert rec.roles() == {"profile_off": "off", "profile_max": "n2-m1"}
    assert set(rec.needs) == {"<4k/prose", "16k-32k/code"}
    assert any("code, 64k+ tokens: no setting beats off" in r for r in rec.profiles[0].reasons)
    assert rec.provisional is None
