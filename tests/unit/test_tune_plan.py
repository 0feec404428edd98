"""The pure parts of tune's plan and verdicts: classes in words, the workload sized to the
server's real context, failures counted and classes given up, paired speedups, the load level
of a busy service, what a running service can measure, and a recommendation that never keeps a
profile for a figure at or below off and recommends nothing over off without a spread."""

from __future__ import annotations

import argparse
import io
from dataclasses import replace
from pathlib import Path

import pytest

from proxy.config.routing import RoutingSettings
from proxy.tune.measure.failures import CONTEXT, SKIPPED, Failures, reason_of
from proxy.tune.measure.reading import Measurement
from proxy.tune.measure.store import ResultStore
from proxy.tune.plan.context import ServerContext
from proxy.tune.plan.grid import OFF, DraftSetting
from proxy.tune.plan.workload import builtin_workload, fit_workload
from proxy.tune.report.analysis import Cell, Spread, Table, analyse, paired_ratios
from proxy.tune.report.chart import chart_name
from proxy.tune.report.labels import class_words, file_part
from proxy.tune.report.outputs import RunReport, profiles_toml, rows, verdict
from proxy.tune.report.recommend import measured_headline, recommend
from proxy.tune.report.summary import NOT_REACHED, _no_data, confirm_command
from proxy.tune.run.job import Job
from proxy.tune.run.progress import Progress
from proxy.tune.run.service import ServedModel

N1, N2, N3, N4 = DraftSetting(1), DraftSetting(2), DraftSetting(3), DraftSetting(4)
N3M1 = DraftSetting(3, 1)
BUCKETS = RoutingSettings().context_buckets
TINY = ServerContext(2048, 1, {"code": 1.1, "prose": 1.2})  # the tiny model: ~1 char a token


def test_class_names_in_words_and_files_keep_the_class() -> None:
    assert class_words("16k-32k/code") == "code, 16-32k tokens"
    assert class_words("<4k/prose") == "prose, under 4k tokens"
    assert class_words("64k+/code") == "code, 64k+ tokens"
    assert class_words("<4k/prose@2") == "prose, under 4k tokens, 2-3 decoding at once"
    assert class_words("4k-16k/code@4") == "code, 4-16k tokens, 4+ decoding at once"
    assert chart_name("64k+/code") == "chart-64k+-code.png"
    assert chart_name("<4k/prose") == "chart-lt4k-prose.png"
    assert file_part("32k-64k/code@2") == "32k-64k-code-at2"
    labels = [f"{b}/{k}" for b in ("<4k", "4k-16k", "16k-32k", "32k-64k", "64k+") for k in "ab"]
    assert len({chart_name(label) for label in labels}) == len(labels)


def test_classes_that_do_not_fit_the_servers_context_are_left_out_with_the_reason() -> None:
    # The config says -c 100000; the server holds 2,048 tokens per slot.
    planned = builtin_workload(100_000, BUCKETS, "m")
    fitted = fit_workload(
        builtin_workload(100_000, BUCKETS, "m", server=TINY), RoutingSettings(), TINY
    )
    assert len(planned.items) == 12
    left = fitted.left_out_classes()
    assert set(left) == {f"{b}/{k}" for b in ("4k-16k", "16k-32k", "32k-64k", "64k+")
                         for k in ("code", "prose")}  # fmt: skip
    assert "the server's context is 2,048 tokens per slot" in left["64k+/code"]
    assert "needs over 65,536 prompt tokens" in left["64k+/code"]
    # What fits is sized to the slot: the <4k prompts shrink to it, and are planned.
    assert fitted.planned_classes() == ["<4k/code", "<4k/prose"]
    assert [i.id for i in fitted.items] == [
        "greeting", "python-game", "code-512", "prose-768",
    ]  # fmt: skip


def test_a_trace_request_over_the_context_is_left_out() -> None:
    big = builtin_workload(100_000, BUCKETS, "m")  # prompts sized for a 100k context
    fitted = fit_workload(big, RoutingSettings(), ServerContext(8192, 1, {"code": 3.3}))
    # 8,192 prompt tokens and the output do not fit 8,192 either.
    assert {left.item for left in fitted.left_out} == {
        f"{kind}-{n}" for kind in ("code", "prose") for n in (8192, 23170, 46340, 81920)
    }
    assert all("8,192 tokens per slot" in left.reason for left in fitted.left_out)


def test_failures_are_counted_per_class_and_reason_and_a_dead_class_is_given_up() -> None:
    detail = '{"error":{"type":"exceed_context_size_error","message":"the request exceeds..."}}'
    assert reason_of(400, detail) == CONTEXT
    assert reason_of(503, "Loading model") == "HTTP 503"
    f = Failures()
    for setting in ("off", "n1", "n3"):
        f.attempt("<4k/code", 1)
        f.add("<4k/code", CONTEXT, f"{setting}: ...")
    assert not f.given_up("<4k/code", 1)  # the first repeat is tried under every setting
    assert f.given_up("<4k/code", 2)  # ... not the later ones
    f.skip("<4k/code")
    f.attempt("<4k/prose", 1)
    f.add("<4k/prose", "HTTP 500", "n3: ...")
    f.answered("<4k/prose")
    assert not f.given_up("<4k/prose", 2)  # one answer: the class is worth trying again
    assert f.total == 4
    table = f.table()
    assert table.count("\n") == 4  # header, rule, one line per (class, reason): no line each
    assert "code, under 4k tokens" in table and "       3  " + CONTEXT in table
    assert SKIPPED in table


def _m(setting: str, item: str, repeat: int, tok_s: float, others: float | None = None):
    return Measurement(
        setting=setting, item=item, repeat=repeat, tag=f"tune {item}.{repeat}", mode="x",
        context_tokens=20, cached_tokens=0, output_tokens=100, decode_tok_s=tok_s,
        prefill_s=0.1, total_s=3.0, draft_n=None, draft_n_accepted=None, others=others,
    )  # fmt: skip


def test_paired_speedup_uses_the_requests_both_answered() -> None:
    # Repeat 2: the fast item failed under n3 (answered under off). Pairing on both requests
    # would compare n3's slow item alone with off's mix of both.
    off = {1: [_m("off", "a", 1, 10), _m("off", "b", 1, 40)], 2: [_m("off", "a", 2, 10),
           _m("off", "b", 2, 40)]}  # fmt: skip
    n3 = {1: [_m("n3", "a", 1, 20), _m("n3", "b", 1, 80)], 2: [_m("n3", "a", 2, 20)]}
    assert paired_ratios(n3, off) == [2.0, 2.0]


def test_requests_beside_users_go_to_the_cell_of_their_load_level() -> None:
    workload = builtin_workload(2048, BUCKETS, "m")
    ms = [_m("off", "greeting", r, 30.0) for r in (1, 2)]
    ms += [_m("off", "greeting", 3, 20.0, others=2.0)]  # three decoding at once: level 2
    table = analyse(ms, workload, [OFF], RoutingSettings(), "m")
    labels = sorted(c.label for c in table.cells)
    assert labels == ["<4k/prose", "<4k/prose@2"]
    assert {c.label: c.requests for c in table.cells} == {"<4k/prose": 2, "<4k/prose@2": 1}


def _cell(setting: DraftSetting, label: str, lo: float, hi: float, *, repeats: int = 3,
          speedup: float | None = None) -> Cell:  # fmt: skip
    mid = (lo + hi) / 2
    s = speedup if speedup is not None else mid / 40.0
    return Cell(
        setting=setting, label=label, repeats=repeats, requests=repeats,
        tok_s=Spread(mid, lo, hi), acceptance=None, prefill_s=None, goodput=None,
        speedup=Spread(s, s, s), mode="per-process",
    )  # fmt: skip


def test_a_figure_at_or_below_off_is_never_a_reason_to_keep_a_profile() -> None:
    table = Table(
        cells=[
            _cell(OFF, "<4k/prose", 39, 40, speedup=1.0),
            _cell(N3, "<4k/prose", 60, 66),
            _cell(N4, "<4k/prose", 58, 64),
            _cell(OFF, "64k+/code", 29, 30, speedup=1.0),
            # Faster tok/s beyond the spread, but its paired figure is below off (0.96x): no.
            _cell(N4, "64k+/code", 31, 32, speedup=0.96),
        ]
    )
    rec = recommend(table)
    assert [p.name for p in rec.profiles] == ["off", "n3"]
    text = "\n".join(r for p in rec.profiles for r in p.reasons)
    assert "0.96x" not in text
    assert "code, 64k+ tokens: no setting beats off" in text


def test_one_repeat_is_provisional_and_recommends_nothing_over_off() -> None:
    table = Table(
        cells=[
            _cell(OFF, "<4k/prose", 40, 40, repeats=1, speedup=1.0),
            _cell(N3, "<4k/prose", 70.8, 70.8, repeats=1, speedup=1.77),
        ]
    )
    rec = recommend(table)
    assert [p.name for p in rec.profiles] == ["off"]
    assert rec.provisional is not None and "one repeat" in rec.provisional
    assert any("candidate, not recommended" in n and "1.77x" in n for n in rec.notes)
    n3 = table.cell("<4k/prose", N3)
    assert n3 is not None and verdict(n3, table) == "best, one repeat: no spread"
    report = RunReport("m", "builtin", 2, 3, 1, "now", interrupted=True)
    text = profiles_toml(rec, report)
    assert "PROVISIONAL" in text and "1 of 3 repeats, interrupted" in text
    assert [r["verdict"] for r in rows(table)] == ["", "best, one repeat: no spread"]


def test_interrupted_is_provisional_even_with_spreads() -> None:
    table = Table(cells=[_cell(OFF, "<4k/prose", 39, 40, speedup=1.0),
                         _cell(N3, "<4k/prose", 60, 66)])  # fmt: skip
    rec = recommend(table, interrupted=True)
    assert rec.provisional == "the run was interrupted"
    assert [p.name for p in rec.profiles] == ["off", "n3"]  # measured with a spread: kept


def test_roles_go_to_the_deepest_and_the_next() -> None:
    table = Table(
        cells=[
            _cell(OFF, "<4k/prose", 39, 40, speedup=1.0),
            _cell(N3M1, "<4k/prose", 60, 66),
            _cell(OFF, "16k-32k/code", 35, 36, speedup=1.0),
            _cell(N2, "16k-32k/code", 45, 46),
            _cell(N3M1, "16k-32k/code", 30, 31),
        ]
    )
    rec = recommend(table)
    assert [p.name for p in rec.profiles] == ["off", "n2", "n3-m1"]
    assert rec.roles() == {"profile_off": "off", "profile_max": "n3-m1", "profile_min": "n2"}


# What /admin/service says of a model served off / max (n_max 3), its process started at 3.
PROFILES: list[dict[str, object]] = [
    {"name": "off", "depth": 0, "spec_type": None, "n_max": None, "n_min": None, "p_min": None},
    {"name": "max", "depth": 3, "spec_type": "draft-mtp", "n_max": 3, "n_min": None,
     "p_min": None},
]  # fmt: skip
PROCESS: dict[str, object] = {"spec_type": "draft-mtp", "n_max": 3, "n_min": None, "p_min": None}


def _served(shape: str) -> ServedModel:
    return ServedModel(
        name="m", backend="llama-server", context=100_000, shape=shape, decided=True,
        start_depth=3, profiles=PROFILES, processes={"m/one-process": PROCESS}, backends=["m/x"],
    )  # fmt: skip


def test_a_running_process_serves_the_depths_of_its_own_n_min_and_p_min_only() -> None:
    model = _served("one-process")
    routes, refused = model.routes([OFF, N2, N3, N4, N3M1, DraftSetting(2, None, 0.5)])
    assert {s.name: (r.pin, r.depth) for s, r in routes.items()} == {
        "off": ("off", 0), "n2": ("max", 2), "n3": ("max", 3),
    }  # fmt: skip
    assert "deeper than the running process (3)" in refused["n4"]
    assert "needs n_min 1 / p_min unset" in refused["n3-m1"]
    assert "only n_max is per request" in refused["n2-p0.5"]
    pool = _served("pool")
    routes, refused = pool.routes([OFF, N2, N3])
    assert {s.name: (r.pin, r.depth) for s, r in routes.items()} == {
        "off": ("off", None), "n3": ("max", None),
    }  # fmt: skip
    assert "only their settings are served" in refused["n2"]


def test_the_time_left_follows_the_measured_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    """10 requests planned at 10 s each and two backend starts at 5 s: the run measures twice
    as slowly as planned (long prompts prefill slower than the warm-up's), so the time left
    doubles for the requests; a start costs what the starts took."""
    now = [1000.0]
    monkeypatch.setattr("proxy.tune.run.progress.time.monotonic", lambda: now[0])
    stream = io.StringIO()
    progress = Progress(10, 100.0, stream, starts=2, start_s=5.0)
    assert progress.eta_s() == 110.0  # the plan: 100 s of requests and two 5 s starts
    now[0] += 8.0
    progress.started(8.0)  # one start took 8 s (the mean with the warm-up's: 6.5 s)
    for _ in range(2):
        now[0] += 20.0
        progress.tick("r", 10.0)
    assert progress.eta_s() == pytest.approx(80.0 * 2 + 6.5)
    progress.skip(10.0)  # a request of a given-up class: never sent
    assert progress.total == 9 and progress.eta_s() == pytest.approx(70.0 * 2 + 6.5)
    assert "left ~2m46s" in stream.getvalue()  # printed with each request (not a terminal)


def test_the_estimate_is_said_again_after_the_first_requests_measured() -> None:
    """The plan said 10 s a request (a warm-up, or priors); the first three took 1 s each (a
    small model that stops early): the run says its new total once, at the third."""
    now = [0.0]
    stream = io.StringIO()
    progress = Progress(20, 200.0, stream, clock=lambda: now[0])
    for _ in range(2):
        now[0] += 1.0
        progress.tick("r", 10.0)
    assert "in all now" not in stream.getvalue()
    now[0] += 1.0
    progress.tick("r", 10.0)
    said = [line for line in stream.getvalue().splitlines() if "in all now" in line]
    assert said == [
        "tune: the first 3 requests took 3s where the plan said 30s: ~20s in all now (the plan "
        "said ~3m20s); the time left follows the pace as it goes"
    ]
    for _ in range(5):
        progress.tick("r", 10.0)
    assert stream.getvalue().count("in all now") == 1


def test_a_process_that_ignores_the_depth_or_a_single_process_serves_its_own_setting() -> None:
    stock = replace(_served("one-process"), draft_control="ignored")
    routes, refused = stock.routes([OFF, N2, N3])
    assert [s.name for s in routes] == ["off"]
    assert "not seen to honour the per-request depth" in refused["n3"]
    undecided = replace(_served("one-process"), draft_control="undecided")
    assert [s.name for s in undecided.routes([OFF, N2, N3])[0]] == ["off"]
    single = replace(_served("single"), single_profile="max")
    routes, refused = single.routes([OFF, N3])
    assert {s.name: r.pin for s, r in routes.items()} == {"n3": "max"}
    assert refused["off"] == "the service runs m as one process at max"


def test_the_headline_is_what_was_measured_even_when_only_off_is_recommended() -> None:
    # --quick on the demo: one repeat, n_max 3 measured 1.72-1.85x off on short requests.
    table = Table(
        cells=[
            _cell(OFF, "<4k/prose", 40, 40, repeats=1, speedup=1.0),
            _cell(N2, "<4k/prose", 60, 60, repeats=1, speedup=1.5),
            _cell(N3, "<4k/prose", 74, 74, repeats=1, speedup=1.85),
            _cell(OFF, "<4k/code", 40, 40, repeats=1, speedup=1.0),
            _cell(N3, "<4k/code", 69, 69, repeats=1, speedup=1.72),
            _cell(OFF, "64k+/code", 30, 30, repeats=1, speedup=1.0),
            _cell(N3, "64k+/code", 27, 27, repeats=1, speedup=0.9),
        ]
    )
    rec = recommend(table)
    assert [p.name for p in rec.profiles] == ["off"] and rec.provisional
    assert measured_headline(table) == (
        "n_max 3 measured fastest in 2 of 3 classes measured alone, 1.72x-1.85x off's speed; "
        "off in 1"
    )
    slow = Table(cells=[_cell(OFF, "<4k/prose", 40, 40, speedup=1.0),
                        _cell(N3, "<4k/prose", 30, 31, speedup=0.8)])  # fmt: skip
    assert measured_headline(slow) == "off measured fastest in every class measured alone (1)"


def test_the_confirming_command_keeps_the_grid_adds_repeats_and_hides_the_key() -> None:
    quick = argparse.Namespace(
        url="http://127.0.0.1:8080", admin_key="s3cret", config=None, model=None,
        workload="builtin", mode="auto", time_scale=None, quick=True, settings=None,
        repeats=None, out=Path("tune-results"),
    )  # fmt: skip
    command = confirm_command(quick, interrupted=False)
    assert command == (
        "mtp-proxy tune --url http://127.0.0.1:8080 --admin-key KEY --settings off,2,3,3/1 "
        "--repeats 3 --out tune-results"
    )
    own = argparse.Namespace(**{**vars(quick), "url": None, "admin_key": None,
                                "config": Path("c.toml"), "time_scale": 100.0})  # fmt: skip
    assert confirm_command(own, interrupted=False).startswith(
        "mtp-proxy tune --config c.toml --time-scale 100 --settings off,2,3,3/1"
    )


def test_classes_a_ctrl_c_never_reached_are_not_reached_not_failed(tmp_path: Path) -> None:
    workload = fit_workload(builtin_workload(8192, BUCKETS, "m"), RoutingSettings(), None)
    job = Job(
        args=argparse.Namespace(), model="m", routing=RoutingSettings(), grid=[OFF],
        store=ResultStore(tmp_path), repeats=1, clock_scale=1.0, via="processes",
        configured_ctx=8192, workload=workload,
    )  # fmt: skip
    first = workload.items[0]
    measured = [_m("off", first.id, 1, 30.0)]
    failures = Failures()
    label = workload.classes[workload.items[-1].id]
    failures.add(label, "HTTP 400", "bad")
    gaps = _no_data(job, measured, failures, interrupted=True)
    reached = workload.classes[first.id]
    assert reached not in gaps
    assert gaps[label] == "every request failed (HTTP 400)"
    others = [c for c in workload.planned_classes() if c not in (reached, label)]
    assert others and all(gaps[c] == NOT_REACHED for c in others)
    assert NOT_REACHED.startswith("not reached (interrupted)")
    assert _no_data(job, measured, Failures(), interrupted=False)[label] == "not measured"
