"""Learned statistics: classes, trust threshold, decay, acceptance, persistence."""

from __future__ import annotations

import asyncio
import json
import math
import random
from pathlib import Path

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from proxy.config.routing import RoutingSettings
from proxy.routing.busy import BusyDepths
from proxy.routing.classes import RequestClass, bucket_labels, classify, classify_tokens
from proxy.routing.features import extract_features
from proxy.routing.stats import LearnedStats, dump_stepwise
from proxy.routing.telemetry import Observation

CLS = RequestClass("<4k", "code")


def obs(
    decode: float | None = 40.0,
    *,
    profile: str = "max",
    out: int | None = 200,
    draft: tuple[int, int] | None = (100, 70),
    context: int | None = 3000,
    cached: int | None = 1000,
    prefill_s: float | None = 2.0,
    total_s: float | None = 7.0,
) -> Observation:
    d, a = draft if draft is not None else (None, None)
    return Observation(
        backend="b",
        profile=profile,
        request_class=CLS,
        context_tokens=context,
        cached_tokens=cached,
        output_tokens=out,
        draft_n=d,
        draft_n_accepted=a,
        decode_tok_s=decode,
        prefill_s=prefill_s,
        ttft_s=prefill_s,
        total_s=total_s,
        source="timings",
    )


def test_bucket_labels_and_classify() -> None:
    s = RoutingSettings()
    assert bucket_labels(s.context_buckets) == ["<4k", "4k-16k", "16k-32k", "32k-64k", "64k+"]
    assert bucket_labels([1000, 5000]) == ["<1000", "1000-5000", "5000+"]
    assert classify_tokens(0, "prose", s) == RequestClass("<4k", "prose")
    assert classify_tokens(4095, "code", s).bucket == "<4k"
    assert classify_tokens(4096, "code", s).bucket == "4k-16k"
    assert classify_tokens(65536, "code", s).bucket == "64k+"
    assert classify_tokens(10**7, "code", s).label == "64k+/code"
    f = extract_features(
        "chat",
        {"messages": [{"role": "user", "content": "a" * 70_000}]},
        chars_per_token=3.5,
        session_header=None,
        pin_header=None,
    )
    assert classify(f, s) == RequestClass("16k-32k", "prose")


def test_settings_validation() -> None:
    with pytest.raises(ValidationError):
        RoutingSettings(context_buckets=[4096, 4096])
    with pytest.raises(ValidationError):
        RoutingSettings(context_buckets=[])
    with pytest.raises(ValidationError):
        RoutingSettings(min_samples=0)
    with pytest.raises(ValidationError):
        RoutingSettings(exploration_rate=0.5)
    with pytest.raises(ValidationError):
        RoutingSettings(profile_min="off")
    with pytest.raises(ValidationError):
        RoutingSettings(unknown_knob=1)  # type: ignore[call-arg]
    s = RoutingSettings(profile_max="turbo")
    assert s.resolve_pin("max") == "turbo"
    assert s.resolve_pin("custom") == "custom"
    assert s.is_speculative("turbo") and not s.is_speculative("off")


def test_untrusted_below_min_samples() -> None:
    stats = LearnedStats(RoutingSettings(min_samples=5))
    for i in range(4):
        stats.observe(CLS, "max", obs(40.0 + i))
        assert stats.estimate(CLS, "max") is None
        assert not stats.view(CLS)["max"].trusted
    stats.observe(CLS, "max", obs(44.0))
    est = stats.estimate(CLS, "max")
    assert est is not None and est.trusted
    assert est.decode_tok_s == pytest.approx(42.0, rel=0.01)  # near-equal weights early on
    assert est.decode_sd > 0
    assert stats.estimate(CLS, "off") is None
    assert stats.estimate(RequestClass("64k+", "code"), "max") is None


def test_decay_halves_old_evidence_after_one_half_life() -> None:
    half_life = 20.0
    settings = RoutingSettings(half_life_samples=half_life, change_detection=False)
    stats = LearnedStats(settings)
    for _ in range(2000):  # saturate the effective weight
        stats.observe(CLS, "max", obs(60.0))
    est = stats.estimate(CLS, "max")
    assert est is not None
    ceiling = est.samples
    assert ceiling == pytest.approx(1 / (1 - 0.5 ** (1 / half_life)), rel=1e-6)
    for _ in range(int(half_life)):
        stats.observe(CLS, "max", obs(20.0))  # drift: the profile got slower
    est = stats.estimate(CLS, "max")
    assert est is not None
    assert est.decode_tok_s == pytest.approx(40.0, rel=1e-6)  # old and new weigh the same
    assert est.samples == pytest.approx(ceiling, rel=1e-6)  # weight stays bounded
    for _ in range(200):
        stats.observe(CLS, "max", obs(20.0))
    est = stats.estimate(CLS, "max")
    assert est is not None and est.decode_tok_s == pytest.approx(20.0, rel=0.01)


def test_acceptance_is_token_weighted_and_unknown_is_skipped() -> None:
    stats = LearnedStats(RoutingSettings(min_samples=1))
    stats.observe(CLS, "max", obs(draft=(10, 10)))
    stats.observe(CLS, "max", obs(draft=(90, 0)))
    stats.observe(CLS, "max", obs(draft=None))  # usage-only response: acceptance unknown
    est = stats.view(CLS)["max"]
    assert est.acceptance is not None
    assert est.acceptance == pytest.approx(10 / 100, rel=0.02)
    assert est.acceptance_count == 2
    assert est.acceptance_samples < 2.0  # decayed weight
    assert est.acceptance_trusted(5) is None
    assert est.acceptance_trusted(1) == est.acceptance
    stats.observe(CLS, "off", obs(profile="off", draft=(0, 0)))
    assert stats.view(CLS)["off"].acceptance is None  # nothing drafted: no acceptance


def test_prefill_output_and_decode_inferred_without_timings() -> None:
    stats = LearnedStats(RoutingSettings(min_samples=1, prior_prefill_tok_s=1000))
    # 2000 uncached tokens in 2 s -> 1000 tok/s
    stats.observe(CLS, "off", obs(profile="off", context=3000, cached=1000, prefill_s=2.0))
    est = stats.view(CLS)["off"]
    assert est.prefill_tok_s == pytest.approx(1000.0)
    assert est.output_tokens == pytest.approx(200.0)
    # usage-only, non-stream: 7 s total - 2 s expected prefill -> 200 tokens in 5 s
    stats.observe(CLS, "min", obs(None, profile="min", prefill_s=None, total_s=7.0))
    assert stats.view(CLS)["min"].decode_tok_s == pytest.approx(200 / 5.0)
    # tiny outputs say nothing about decode speed
    stats.observe(CLS, "max", obs(999.0, out=2))
    assert stats.view(CLS)["max"].decode_tok_s is None


def test_table_rows() -> None:
    stats = LearnedStats(RoutingSettings(min_samples=2))
    for _ in range(3):
        stats.observe(CLS, "max", obs(50.0))
    stats.observe(RequestClass("64k+", "prose"), "off", obs(30.0, profile="off", draft=(0, 0)))
    rows = stats.table()
    assert [(r["class"], r["profile"]) for r in rows] == [
        ("64k+/prose", "off"),
        ("<4k/code", "max"),
    ]
    max_row = rows[1]
    assert max_row["trusted"] is True
    assert max_row["decode_tok_s"] == 50.0
    assert max_row["acceptance"] == 0.7
    assert rows[0]["trusted"] is False
    assert rows[0]["acceptance"] is None
    json.dumps(rows)  # JSON-serializable for the admin endpoint


def test_models_are_kept_apart() -> None:
    stats = LearnedStats(RoutingSettings(min_samples=1))
    stats.observe(CLS, "max", obs(50.0), model="a")
    stats.observe(CLS, "max", obs(20.0), model="b")
    assert stats.view(CLS, "a")["max"].decode_tok_s == 50.0
    assert stats.for_model("b").view(CLS)["max"].decode_tok_s == 20.0
    assert stats.view(CLS) == {}
    assert [(r["model"], r["decode_tok_s"]) for r in stats.table()] == [("a", 50.0), ("b", 20.0)]


def test_save_and_load_roundtrip(tmp_path: Path) -> None:
    settings = RoutingSettings(min_samples=2)
    stats = LearnedStats(settings)
    for i in range(10):
        stats.observe(CLS, "max", obs(40.0 + i), load=i % 3)
        stats.observe(RequestClass("16k-32k", "prose"), "off", obs(30.0, profile="off"))
        stats.observe(CLS, "max", obs(70.0), model="other")
    f = extract_features(
        "chat",
        {"model": "m", "messages": [{"role": "user", "content": "a" * 3000}]},
        chars_per_token=3.5,
        session_header=None,
        pin_header=None,
    )
    stats.calibrator.observe(f, 1000)
    path = tmp_path / "state" / "routing.json"
    stats.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["routing.json"]  # no temp left over
    loaded = LearnedStats.load(path, settings)
    assert loaded.load_report.startswith("loaded 3 cells")
    assert loaded.table() == stats.table()
    assert loaded.view(CLS)["max"].decode_load == pytest.approx(stats.view(CLS)["max"].decode_load)
    assert 0.5 < loaded.view(CLS)["max"].decode_load < 1.5
    assert loaded.calibrator.chars_per_token("m") == stats.calibrator.chars_per_token("m") != 3.5
    # observing after a restart continues from the restored weights
    loaded.observe(CLS, "max", obs(40.0))
    stats.observe(CLS, "max", obs(40.0))
    assert loaded.table() == stats.table()
    stats.save(path)  # overwrite in place
    assert LearnedStats.load(path, settings).table() == stats.table()


def test_load_missing_or_unreadable_starts_empty_and_keeps_the_file(tmp_path: Path) -> None:
    settings = RoutingSettings()
    missing = LearnedStats.load(tmp_path / "nope.json", settings)
    assert missing.table() == []
    assert missing.load_report.startswith("missing")
    assert list(tmp_path.iterdir()) == []  # nothing to keep
    bad = tmp_path / "bad.json"
    for content in (b"{not json", b"[]", b'{"version": 99, "cells": []}', b"\xff\xfe"):
        bad.write_bytes(content)
        stats = LearnedStats.load(bad, settings)
        assert stats.table() == []
        assert "starting empty" in stats.load_report
        assert stats.load_report.endswith(f"; kept as {bad}.rejected")
        assert Path(f"{bad}.rejected").read_bytes() == content


def test_load_drops_the_cells_it_cannot_trust_and_keeps_the_rest(tmp_path: Path) -> None:
    """One bad number once cost every cell: the file was refused whole and the next save wrote
    the empty state over it. Now only the bad cells go, the log names them, and the file as it
    was is kept as <name>.rejected."""
    settings = RoutingSettings(min_samples=1)
    stats = LearnedStats(settings)
    for profile in ("off", "max"):
        stats.observe(CLS, profile, obs(40.0))
    path = tmp_path / "learned.json"
    stats.save(path)
    good = LearnedStats.load(path, settings).table()
    state = json.loads(path.read_bytes())
    max_cell = next(c for c in state["cells"] if c["profile"] == "max")
    for poison in (-40, "NaN", "Infinity", None):
        max_cell["decode"][1] = poison
        bad = json.dumps(state).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
        path.write_text(bad)
        with capture_logs() as logs:
            loaded = LearnedStats.load(path, settings)
        assert loaded.table() == [row for row in good if row["profile"] == "off"], poison
        assert loaded.load_report == (
            f"loaded 1 cells, dropped 1 (1 untrusted; kept as {path}.rejected)"
        )
        assert Path(f"{path}.rejected").read_text() == bad
        (warning,) = [line for line in logs if line["event"] == "stats_state_cells_dropped"]
        assert warning["log_level"] == "warning" and warning["untrusted"] == 1
        (why,) = warning["dropped"]
        assert why.startswith("cell <4k/code/max@0: "), why
    del max_cell["decode"]  # a field missing: the same
    path.write_text(json.dumps(state))
    loaded = LearnedStats.load(path, settings)
    assert "(1 untrusted; kept as " in loaded.load_report
    assert [r["profile"] for r in loaded.table()] == ["off"]


def test_load_drops_cells_of_changed_buckets(tmp_path: Path) -> None:
    old = RoutingSettings(context_buckets=[1000, 2000], min_samples=1)
    stats = LearnedStats(old)
    stats.observe(RequestClass("1000-2000", "code"), "max", obs())
    stats.observe(RequestClass("<1000", "code"), "max", obs())
    path = tmp_path / "s.json"
    stats.save(path)
    new = RoutingSettings(context_buckets=[1000, 4000], min_samples=1)
    loaded = LearnedStats.load(path, new)
    assert loaded.load_report == "loaded 1 cells, dropped 1"
    assert [r["class"] for r in loaded.table()] == ["<1000/code"]


def test_load_levels_are_kept_apart_and_survive_a_restart(tmp_path: Path) -> None:
    settings = RoutingSettings()
    stats = LearnedStats(settings)
    cls = RequestClass("<4k", "prose")
    for level, speed in ((1, 50.0), (2, 20.0)):
        for _ in range(6):
            stats.observe(cls, "max", _obs_for_levels(speed), model="m", level=level)
    assert stats.view(cls, "m", 1)["max"].decode_tok_s == pytest.approx(50.0)
    assert stats.view(cls, "m", 2)["max"].decode_tok_s == pytest.approx(20.0)
    assert stats.view(cls, "m") == {}  # the pool's cells (level 0) are separate
    labels = sorted(str(row["class"]) for row in stats.table())
    assert labels == ["<4k/prose@1", "<4k/prose@2"]
    path = tmp_path / "state.json"
    stats.save(path)
    loaded = LearnedStats.load(path, settings)
    assert loaded.view(cls, "m", 2)["max"].decode_tok_s == pytest.approx(20.0)
    fewer = LearnedStats.load(path, RoutingSettings(concurrency_levels=[1, 4]))
    assert fewer.load_report == "loaded 1 cells, dropped 1"


def _obs_for_levels(speed: float) -> Observation:
    return Observation(
        backend="m/one-process",
        profile="max",
        request_class=RequestClass("<4k", "prose"),
        context_tokens=500,
        cached_tokens=0,
        output_tokens=100,
        draft_n=None,
        draft_n_accepted=None,
        decode_tok_s=speed,
        prefill_s=None,
        ttft_s=None,
        total_s=None,
        source="timings",
    )


# --- change detection ----------------------------------------------------------------------------


def test_a_class_whose_speed_moves_far_explores_again() -> None:
    stats = LearnedStats(RoutingSettings())
    for _ in range(30):
        stats.observe(CLS, "max", obs(40.0))
        stats.observe(CLS, "off", obs(30.0, profile="off", draft=None))
    assert stats.estimate(CLS, "max") is not None and stats.estimate(CLS, "off") is not None
    stats.observe(CLS, "max", obs(20.0))  # halved: one is not enough ...
    assert stats.estimate(CLS, "max") is not None and not stats.changes
    stats.observe(CLS, "max", obs(20.0))  # ... the second says it
    assert stats.estimate(CLS, "max") is None and stats.estimate(CLS, "off") is None
    assert stats.changes == [
        {
            "model": "",
            "class": "<4k/code",
            "profile": "max",
            "learned_tok_s": 39.21,
            "measured_tok_s": 20.0,
        }
    ]
    for _ in range(5):  # it learns again, and the new speed outweighs the old one
        stats.observe(CLS, "max", obs(20.0))
    est = stats.estimate(CLS, "max")
    assert est is not None and est.decode_tok_s < 25.0  # (one old weight, six new)


@pytest.mark.parametrize(("drop", "at"), [(0.5, 2), (0.7, 6), (1.5, 5), (0.85, None)])
def test_how_far_and_how_fast(drop: float, at: int | None) -> None:
    """Halved: the 2nd request says it; -30 %: the 6th; +50 %: the 5th; -15 %, about a class's
    own spread: never (the decay follows it instead)."""
    stats = LearnedStats(RoutingSettings())
    for _ in range(30):
        stats.observe(CLS, "max", obs(40.0))
    signalled = None
    for n in range(1, 41):
        stats.observe(CLS, "max", obs(40.0 * drop))
        if stats.changes:
            signalled = n
            break
    assert signalled == at


def test_noise_of_a_class_own_spread_does_not_reset_it() -> None:
    rng = random.Random(5)
    stats = LearnedStats(RoutingSettings())
    for _ in range(5000):  # per-request speeds spread ~12 % (lognormal) around 40 tok/s
        stats.observe(CLS, "max", obs(40.0 * math.exp(rng.gauss(0.0, 0.12))))
    assert not stats.changes


def test_change_detection_can_be_turned_off() -> None:
    stats = LearnedStats(RoutingSettings(change_detection=False))
    for speed in [40.0] * 30 + [10.0] * 10:
        stats.observe(CLS, "max", obs(speed))
    assert not stats.changes and stats.estimate(CLS, "max") is not None


def many_cells(models: int) -> LearnedStats:
    """A large state: every class, level and profile of `models` models, and busy epochs."""
    settings = RoutingSettings()
    stats = LearnedStats(settings)
    for m in range(models):
        for bucket in bucket_labels(settings.context_buckets):
            for level in (0, *settings.concurrency_levels):
                for profile in ("off", "min", "max"):
                    cls = RequestClass(bucket, "code")
                    stats.observe(cls, profile, obs(30.0 + m), model=f"m{m}", level=level)
                    busy = stats.busy.setdefault(f"m{m}/one-process", BusyDepths())
                    busy.observe(cls, level, profile, 30.0 + m, 1.0, 0.9)
    return stats


def old_dumps(stats: LearnedStats) -> bytes:
    """The learned file's bytes as the one-piece serializer wrote them (its format is kept)."""
    state = json.loads(stats.dumps())
    return json.dumps(state, separators=(",", ":")).encode()


def test_the_stepwise_save_writes_the_same_bytes() -> None:
    stats = many_cells(3)
    assert b"".join(p for p in stats.dump_pieces(7) if p is not None) == stats.dumps()
    assert stats.dumps() == old_dumps(stats)
    assert asyncio.run(dump_stepwise(stats, 7)) == stats.dumps()
    assert asyncio.run(dump_stepwise(LearnedStats(RoutingSettings()))) == old_dumps(
        LearnedStats(RoutingSettings())
    )


def test_the_stepwise_save_lets_the_event_loop_run_between_steps() -> None:
    """A large state saved on the event loop: other tasks (requests) run between its steps,
    as many times as there are steps; the one-piece dump ran them not at all (a second's
    stall per save with 48,000 cells)."""
    stats = many_cells(20)
    rows = len(json.loads(stats.dumps())["cells"])
    step = 64

    async def save_while_serving() -> int:
        turns = 0
        saving = True

        async def serve() -> None:
            nonlocal turns
            while saving:
                turns += 1
                await asyncio.sleep(0)

        server = asyncio.create_task(serve())
        await asyncio.sleep(0)
        await dump_stepwise(stats, step)
        saving = False
        await server
        return turns

    assert asyncio.run(save_while_serving()) >= rows // step
