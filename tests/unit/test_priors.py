"""Learned state keyed by what it learned on, exports as sums, imports as priors
(proxy.routing.priors): a merge is a sum, a bad file or another key is refused whole, the priors
seed what a box has not learned and its own requests outweigh them within tens."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from proxy.config.routing import RoutingSettings
from proxy.routing.priors import (
    ExportRefused,
    LearnedKey,
    adopt,
    export_document,
    merge,
    read_export,
)
from proxy.routing.stats import LearnedStats
from tests.unit.test_stats import CLS, obs

KEY = LearnedKey("version: 1 (abc)", "1000:aa", "draft-mtp", "", "box-a")
SETTINGS = RoutingSettings(min_samples=3)


def learned(speeds: dict[str, float], n: int = 10, model: str = "m") -> LearnedStats:
    stats = LearnedStats(SETTINGS)
    for profile, speed in speeds.items():
        for _ in range(n):
            stats.observe(CLS, profile, obs(speed, profile=profile), model=model)
    return stats


def exported(stats: LearnedStats, key: LearnedKey = KEY) -> dict[str, object]:
    raw = json.dumps(export_document(stats, {"m": key})).encode()
    return read_export(raw, "a.json")


def test_an_import_seeds_the_exporters_estimates_trusted_and_light() -> None:
    a = learned({"off": 30.0, "max": 50.0})
    b = LearnedStats(SETTINGS)
    b.priors = merge([("a.json", exported(a))], {"m": replace(KEY, box="box-b")})
    adopt(b, {"m": replace(KEY, box="box-b")}, weight=3.0)
    for profile, speed in (("off", 30.0), ("max", 50.0)):
        estimate = b.estimate(CLS, profile, model="m")
        assert estimate is not None and estimate.trusted  # used at once, not explored again
        assert estimate.decode_tok_s == pytest.approx(speed)
        assert estimate.samples == 3.0
        assert estimate.acceptance == pytest.approx(0.7)
    assert "2 cells from priors" in b.load_report
    # Its own requests win within tens: 20 at another speed move it most of the way.
    for _ in range(20):
        b.observe(CLS, "max", obs(20.0), model="m")
    own = b.estimate(CLS, "max", model="m")
    assert own is not None and own.decode_tok_s is not None and own.decode_tok_s < 25.0


def test_a_merge_is_a_sum() -> None:
    one, two = learned({"max": 40.0}, n=4), learned({"max": 60.0}, n=12)
    merged = merge([("1", exported(one)), ("2", exported(two))], {"m": KEY})
    (row,) = merged["cells"]
    w1, s1 = exported(one)["cells"][0]["decode"][:2]  # type: ignore[index]
    w2, s2 = exported(two)["cells"][0]["decode"][:2]  # type: ignore[index]
    assert row["decode"][:2] == pytest.approx([w1 + w2, s1 + s2])
    assert merged["boxes"] == 2
    assert 40.0 < row["decode"][1] / row["decode"][0] < 60.0


def test_another_key_is_refused_naming_the_field() -> None:
    document = exported(learned({"max": 40.0}))
    for field, value in (("build", "version: 2 (def)"), ("model_hash", "9:bb")):
        with pytest.raises(ExportRefused, match=f"a.json: model m: {field} differs"):
            merge([("a.json", document)], {"m": replace(KEY, **{field: value})})
    merge([("a.json", document)], {"m": replace(KEY, box="elsewhere")})  # the box may differ


@pytest.mark.parametrize(
    ("mangle", "words"),
    [
        (lambda raw: raw[: len(raw) // 2], "not a whole export"),
        (lambda raw: raw.replace(b'"version":1', b'"version":2'), "export version 2"),
        (lambda raw: raw.replace(b'"decode":[', b'"decode":[NaN,', 1), "not a whole export"),
        (lambda raw: raw.replace(b'"decode":[', b'"decode":[-1,', 1), "finite numbers"),
        (lambda raw: b"{}", "not an mtp-proxy learned export"),
    ],
    ids=["truncated", "version", "nan", "negative", "other"],
)
def test_a_bad_file_is_refused_whole(mangle: object, words: str) -> None:
    raw = json.dumps(export_document(learned({"max": 40.0}), {"m": KEY}), separators=(",", ":"))
    bad = mangle(raw.encode())  # type: ignore[operator]
    with pytest.raises(ExportRefused, match=words):
        read_export(bad, "a.json")


def test_a_changed_key_starts_the_model_from_its_priors() -> None:
    stats = learned({"max": 40.0})
    adopt(stats, {"m": KEY}, weight=3.0)  # learned on KEY
    stats.priors = merge([("p", exported(learned({"max": 90.0})))], {"m": KEY})
    saved = LearnedStats(SETTINGS)
    saved._restore(json.loads(stats.dumps()))  # the learned file keeps keys and priors
    assert saved.keys == {"m": KEY.as_json()}
    with capture_logs() as logs:
        adopt(saved, {"m": replace(KEY, build="version: 2 (def)")}, weight=3.0)
    (stale,) = [line for line in logs if line["event"] == "learned_state_stale"]
    assert stale["changed"] == ["build"] and stale["cells_dropped"] == 1
    assert "learned_state_stale: m (build changed)" in saved.load_report
    # The priors were learned on the old build too: nothing to start from, so it starts cold.
    assert saved.estimate(CLS, "max", model="m") is None
    kept = LearnedStats(SETTINGS)
    kept._restore(json.loads(stats.dumps()))
    adopt(kept, {"m": KEY}, weight=3.0)  # the same key: its own cells, not the priors
    estimate = kept.estimate(CLS, "max", model="m")
    assert estimate is not None and estimate.decode_tok_s == pytest.approx(40.0)
