"""The real-engine routing benchmark's pure parts: the traces, each arm's configuration, and the
report from measured requests (a run on the real llama-server:
tests/bench/test_real_routing_bench.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import real_routing
from bench.real_routing_report import (
    Record,
    best_static,
    classifier_report,
    draft_control_report,
    drafted_after,
    goodput,
    headline,
    markdown_table,
    render,
    scenario_report,
)
from bench.real_routing_trace import (
    CLASSES,
    INTENDED,
    MODEL,
    Numbering,
    alone_rounds,
    concurrent_rounds,
    short_rounds,
)
from proxy.config.routing import RoutingSettings
from proxy.config.settings import Settings
from proxy.routing.classes import classify
from proxy.routing.features import extract_features

ARMS = ("static:off", "static:min", "static:max", "adaptive")
DEPTHS = {"off": 0, "min": 8, "max": 16}


def rec(arm: str, cls: str, tokens: int, seconds: float, **kw: Any) -> Record:
    fields: dict[str, Any] = {
        "scenario": "alone",
        "round": 0,
        "index": 0,
        "decode_tok_s": None,
        "profile": arm.removeprefix("static:") if arm != "adaptive" else "max",
        "reason": "pinned" if arm != "adaptive" else "learned",
        "load": 1,
        **kw,
    }
    return Record(arm=arm, cls=cls, output_tokens=tokens, latency_s=seconds, **fields)


def test_the_traces_are_deterministic_and_numbered_once() -> None:
    one, two = Numbering(), Numbering()
    assert alone_rounds(3, 1, 64, one) == alone_rounds(3, 1, 64, two)
    rounds = [
        *alone_rounds(2, 1, 64, one),
        *concurrent_rounds(2, 2, 64, 4, one),
        *short_rounds(2, 3, 64, one),
    ]
    indices = [item.request.index for r in rounds for item in r]
    assert len(indices) == len(set(indices))
    for item in (i for r in rounds for i in r):
        body = item.request.body
        assert (body["model"], body["temperature"], body["max_tokens"]) == (MODEL, 0, 64)


def test_every_class_each_round_and_the_agent_grows() -> None:
    rounds = alone_rounds(4, 1, 64, Numbering())
    assert all([i.cls for i in r] == list(CLASSES) for r in rounds)
    small = alone_rounds(4, 1, 64, Numbering(), scale=0.25)  # the quick run's
    assert all(
        len(str(s.request.body)) < len(str(i.request.body)) / 2
        for s, i in zip(small[-1], rounds[-1], strict=True)
        if i.cls in ("copy", "agent")
    )
    agent = [len(str(r[-1].request.body["messages"])) for r in rounds]
    assert agent == sorted(agent) and agent[-1] > agent[0] + 3000
    assert {i.request.session for r in rounds for i in r} == {"alone"}
    concurrent = concurrent_rounds(2, 2, 64, 4, Numbering())
    for r in concurrent:
        clients = [i.request.session for i in r]
        assert sorted(set(clients)) == [f"client-{k}" for k in range(4)]
        assert all(clients.count(c) == 2 for c in set(clients))


def test_the_classifier_reads_each_trace_class_as_intended() -> None:
    """What the live run's classifier table shows, offline: every class of the generated traces
    gets the kind it is meant to be (the copy's English lead-in does not make it prose)."""
    settings = RoutingSettings()
    for r in alone_rounds(3, 1, 64, Numbering()):
        for item in r:
            features = extract_features(
                "chat", item.request.body, chars_per_token=3.5, session_header=None,
                pin_header=None,
            )  # fmt: skip
            assert classify(features, settings).kind == INTENDED[item.cls], item.cls


def test_each_arm_is_a_valid_config_of_one_process_at_per_request_depths(tmp_path: Path) -> None:
    plan = real_routing.Plan("/bin/true", tmp_path / "m.gguf")
    for spec_type in ("ngram-mod", "draft-simple"):
        for arm in ARMS:
            config = real_routing.proxy_config(plan, arm, spec_type)
            settings = Settings.model_validate(config)
            [model] = settings.models
            assert model.draft_control == "per-request"
            assert [p.draft_n_max for p in model.profiles] == [None, 8, 16]
            assert settings.routing.calibrate == ("auto" if arm == "adaptive" else "off")
            assert model.args[model.args.index("-t") + 1] == "1"
            if spec_type == "draft-simple":
                assert model.profiles[2].draft_model == str(plan.model)  # the target itself
            else:
                assert "--spec-ngram-mod-n-max" in model.args


def test_goodput_and_the_best_static() -> None:
    rows = [rec("static:off", "edit", 100, 2.0), rec("static:off", "edit", 50, 3.0)]
    assert goodput(rows) == pytest.approx(30.0)  # 150 tokens over 5 s, not the mean of ratios
    assert goodput([]) is None
    assert best_static({"static:off": 30.0, "static:max": 40.0, "adaptive": 50.0}) == (
        "static:max",
        40.0,
    )
    assert best_static({"adaptive": 1.0}) == (None, None)


def test_the_scenario_report_per_class_and_round() -> None:
    records = [
        rec("static:off", "edit", 100, 2.0),
        rec("static:max", "edit", 100, 1.0),
        rec("adaptive", "edit", 100, 1.25),
        rec("static:off", "prose", 100, 1.0),
        rec("static:max", "prose", 100, 2.0),
        rec("adaptive", "prose", 100, 1.0, profile="off", reason="explore"),
        rec("static:off", "edit", 100, 2.0, round=1),
        rec("static:max", "edit", 100, 1.0, round=1),
        rec("adaptive", "edit", 100, 1.0, round=1),
    ]
    arms = ("static:off", "static:max", "adaptive")
    found = scenario_report(records, arms)
    edit, prose = found["classes"]["edit"], found["classes"]["prose"]
    assert edit["best_static"] == "static:max" and edit["adaptive_vs_best_static"] == 0.8889
    assert prose["best_static"] == "static:off" and prose["adaptive_vs_best_static"] == 1.0
    assert prose["adaptive_profiles"] == {"off": 1} and prose["adaptive_reasons"] == {"explore": 1}
    trace = found["trace"]  # off 300/5, max 300/4, adaptive 300/3.25
    assert trace["best_static"] == "static:max"
    assert trace["adaptive_vs_best_static"] == pytest.approx(4 / 3.25, abs=1e-4)
    assert found["round_ratios"] == [1.3333, 1.0]  # round 0: off, max 200/3, adaptive 200/2.25
    assert list(found["classes"]) == ["edit", "prose"]  # in CLASSES order, only those run


def test_the_classifier_report_counts_matches_by_kind() -> None:
    records = [
        rec("static:off", "copy", 10, 1.0, proxy_class="<4k/code"),
        rec("adaptive", "copy", 10, 1.0, proxy_class="<4k/prose"),
        rec("adaptive", "agent", 10, 1.0, proxy_class="4k-16k/code"),
        rec("adaptive", "chat", 10, 1.0),  # not logged: left out
    ]
    found = classifier_report(records)
    assert found["copy"] == {
        "intended": "code",
        "proxy_classes": {"<4k/code": 1, "<4k/prose": 1},
        "matched": 0.5,
    }
    assert found["agent"]["matched"] == 1.0 and "chat" not in found


@pytest.mark.parametrize(
    ("profiles", "after"),
    [
        (["max", "max", "off", "max", "off", "off"], 4),
        (["off", "off"], 0),
        (["max", "off", "max"], None),
        ([], 0),
    ],
)
def test_when_drafting_stopped(profiles: list[str], after: int | None) -> None:
    assert drafted_after(profiles) == after


def test_the_draft_control_against_static_off() -> None:
    records = [
        rec("static:off", "edit", 100, 1.0),
        rec("adaptive", "edit", 100, 1.2, index=1, profile="max"),
        rec("adaptive", "edit", 100, 1.0, index=2, profile="off"),
    ]
    found = draft_control_report(records, ("static:off", "adaptive"))
    assert found["adaptive_sequence"] == ["max", "off"]
    assert found["stopped_drafting_after"] == 1
    assert found["adaptive_vs_off"] == 0.9091  # 200 tokens in 2.2 s against 100 in 1 s
    assert found["meets_goal"] is False


def test_the_headline_and_the_text_report() -> None:
    records = [
        rec("static:off", "edit", 100, 2.0, proxy_class="<4k/code"),
        rec("static:min", "edit", 100, 1.5),
        rec("static:max", "edit", 100, 1.0),
        rec("adaptive", "edit", 100, 1.1),
    ]
    report: dict[str, Any] = {
        "spec_type": "ngram-mod",
        "depths": DEPTHS,
        "arms": list(ARMS),
        "control_arms": ["static:off", "adaptive"],
        "scenarios": {"alone": scenario_report(records, ARMS)},
        "draft_control": draft_control_report(
            [rec("static:off", "new", 50, 1.0), rec("adaptive", "new", 50, 1.0, profile="off")],
            ("static:off", "adaptive"),
        ),
        "calibration": {
            "ngram-mod adaptive": {
                "gemma3-270m/one-process": {
                    "levels": {
                        "1": {"deep_vs_off": 1.2, "cold_role": "rules"},
                        "4": {"deep_vs_off": 0.9, "cold_role": "off", "by_kind": {"code": 0.9}},
                    }
                }
            },
            "draft-simple adaptive": {},
        },
        "classifier": classifier_report(records),
        "errors": [],
    }
    report["headline"] = headline(report)
    assert [(r["trace"], r["best_static"]) for r in report["headline"]] == [
        ("alone", "static:max"),
        ("draft-simple control", "static:off"),
    ]
    assert report["headline"][0]["adaptive_vs_best_static"] == pytest.approx(1 / 1.1, abs=1e-4)
    text = render(report)
    assert text.startswith("HEADLINE: adaptive / best static")
    assert "0.909x" in text.splitlines()[1]
    assert "max=16" in text and "@4 0.900x -> off (code 0.90x)" in text
    assert "draft-simple adaptive: none" in text and "(goal >= 0.95x: met); never drafted" in text
    assert "edit   meant code" in text
    table = markdown_table(report).splitlines()
    assert table[0] == (
        "| scenario | class | off=0 | min=8 | max=16 | adaptive | best | adaptive / best "
        "| adaptive ran |"
    )
    assert table[2] == "| alone | edit | 50.0 | 66.7 | 100.0 | 90.9 | max=16 | 0.909x | max 1 |"
    assert table[-1].startswith("draft-simple control: static off 50.0, adaptive 50.0 tok/s")
