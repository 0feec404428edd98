"""The live page (/ui/) in a real browser against a real proxy under traffic.

Debian's chromium, driven by chromedriver (tests/support/browser.py), opens `/ui/#key=ADMIN_KEY`
while an agent-like session and background clients send requests to a model served by one
process on the simulator. It must show, within seconds, every request just sent with the depth
the proxy gave it (the answer's X-MTP-Profile), why (X-MTP-Route-Reason) and its tokens; the
backend with its state; the depth the process runs now; the speedup each depth has earned
against off; the chart. The console must stay free of errors. A screenshot of the page is saved
to build/ui/live-page.png (build/ is ignored by git; CI keeps it as an artifact).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import chromium
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)
from tests.support.traffic import Sent, body_for, send

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "build" / "ui" / "live-page.png"
MODEL = "mtp-demo"
BACKEND = "mtp-demo/one-process"
DEPTH = {"off": 0, "min": 2, "max": 3}
NOTHING = "\u2013"  # what the page shows where there is no value (an en dash)
LEARNED = 5  # requests pinned to off and to max before the page opens: min_samples each


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    model = simulator_model(draft_control="per-request", time_scale=50.0, slots=4)
    routing = {"clock_scale": 50.0, "seed": 1}
    config = proxy_config([model], routing=routing)
    with running_proxy(config, tmp_path_factory.mktemp("live-page")) as running:
        wait_all_ready(running, {MODEL: 1})
        for profile in ("off", "max"):  # alone, one after another: learned at load level 1
            for _ in range(LEARNED):
                pinned = {"X-MTP-Profile": profile}
                assert send(running.url, "chat", body_for("chat", stream=False), headers=pinned)
        yield running


class Background:
    """Clients that keep the proxy busy while the page is looked at."""

    def __init__(self, url: str, clients: int = 2) -> None:
        self.url, self.stop = url, threading.Event()
        self.statuses: list[int] = []
        self.threads = [
            threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(clients)
        ]

    def _loop(self, client: int) -> None:
        turn = 0
        while not self.stop.is_set():
            text = f"background {client}"
            body = body_for("chat", stream=turn % 2 == 0, text=text, max_tokens=32)
            headers = {"X-MTP-Session": f"background-{client}"}
            self.statuses.append(send(self.url, "chat", body, headers=headers).status)
            turn += 1
            self.stop.wait(0.1)

    def __enter__(self) -> Background:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def agent_session(url: str, turns: int = 4) -> list[Sent]:
    """A coding agent's turns: one session, the conversation growing, some streamed."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools to edit files."},
    ]
    sent = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"step {turn}: fix the failing test in app.py"})
        body = {"model": MODEL, "messages": messages, "max_tokens": 48, "stream": turn % 2 == 1}
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}
        answer = send(url, "chat", body, headers={"X-MTP-Session": "agent-session"})
        assert answer.status == 200, answer
        sent.append(answer)
        messages.append({"role": "assistant", "content": f"done with step {turn}"})
    return sent


ROW = """
const row = document.querySelector(`#requests tr[data-id="${arguments[0]}"]`);
if (!row) return null;
const cell = (name) => row.querySelector(`td.${name}`).innerText.trim();
return {depth: row.querySelector("td.c-depth").dataset.depth, depthText: cell("c-depth"),
        reason: cell("c-reason"), output: cell("c-output"), prompt: cell("c-prompt"),
        drafted: cell("c-drafted"), status: cell("c-status")};
"""


def test_the_page_shows_each_request_its_depth_and_why_and_the_backend(
    proxy: ProxyProcess,
) -> None:
    with chromium() as browser, Background(proxy.url) as background:
        browser.open(f"{proxy.url}/ui/#key={ADMIN_KEY}")
        browser.wait_for("the page live", "return document.body.dataset.state === 'live'")
        sent = agent_session(proxy.url)
        for answer in sent:
            shown = browser.wait_for(f"request {answer.request_id} shown", ROW, answer.request_id)
            assert shown["depth"] == str(DEPTH[answer.profile]), (answer, shown)
            assert shown["depthText"] == f"{DEPTH[answer.profile]} {answer.profile}"
            assert shown["reason"].startswith(str(answer.reason)), (answer, shown)
            assert shown["output"] == str(answer.output_tokens) and answer.output_tokens > 0
            assert shown["prompt"].split()[0] == str(answer.context_tokens), (answer, shown)
            drafted = f"{answer.draft_n} / {answer.draft_accepted}" if answer.draft_n else NOTHING
            assert shown["drafted"].split("\n")[0] == drafted, (answer, shown)
            assert shown["status"] == "200"
        state = browser.wait_for(
            "the backend's state",
            "const r = document.querySelector(`#backends tr[data-backend='${arguments[0]}']`);"
            "return r && r.dataset.state;",
            BACKEND,
        )
        assert state == "ready"
        drafts_with = browser.run(
            "return document.querySelector(`#backends tr[data-backend='${arguments[0]}']"
            " td.c-spec`).innerText;",
            BACKEND,
        )
        assert drafts_with == "draft-mtp"  # the one process's type (its profiles' own)
        card = browser.wait_for(
            "the depth the process runs now, and why",
            "const c = document.querySelector(`#depths .card[data-backend='${arguments[0]}']`);"
            "return c && {depth: c.dataset.depth, why: c.querySelector('.why').innerText};",
            BACKEND,
        )
        assert card["depth"] in {NOTHING, *map(str, DEPTH.values())} and card["why"], card
        speedup = browser.wait_for(
            "the speedup max earned against off",
            "const c = document.querySelector("
            "  '#learned td[data-profile=max]:not([data-speedup=\"\"])');"
            "return c && c.dataset.speedup;",
        )
        assert float(speedup) > 0
        browser.wait_for(
            "the chart drawn", "return document.querySelectorAll('#speed-plot circle').length"
        )
        # Follow the agent: its session's tag shows its turns only (what the screenshot shows).
        browser.run(
            "document.querySelector(`#requests tr[data-id='${arguments[0]}'] .session`).click()",
            sent[0].request_id,
        )
        shown_ids = browser.wait_for(
            "only the agent's turns",
            "const rows = [...document.querySelectorAll('#requests tbody tr')];"
            "return rows.every((r) => r.querySelector('.session').innerText === 'agent-session')"
            "  && rows.map((r) => r.dataset.id);",
        )
        assert set(shown_ids) == {answer.request_id for answer in sent}
        browser.full_height()
        png = browser.screenshot(SCREENSHOT)
        errors = browser.console_errors()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert errors == [], errors
    assert background.statuses and set(background.statuses) == {200}


def test_without_a_key_the_page_says_how_to_get_one_and_reads_nothing(
    proxy: ProxyProcess,
) -> None:
    with chromium() as browser:
        browser.open(f"{proxy.url}/ui/")
        browser.wait_for("the no-key notice", "return document.body.dataset.state === 'nokey'")
        shown = browser.run(
            "return {notice: document.querySelector('#nokey').innerText,"
            " live: document.querySelector('#live').hidden,"
            " rows: document.querySelectorAll('#live tbody tr').length,"
            " fetched: performance.getEntriesByType('resource').map((e) => e.name)};"
        )
        errors = browser.console_errors()
    assert "admin_key" in shown["notice"] and "#key=ADMIN_KEY" in shown["notice"]
    assert shown["live"] is True and shown["rows"] == 0
    assert not [url for url in shown["fetched"] if "/admin/" in url], shown["fetched"]
    assert errors == []


def test_a_wrong_key_is_refused_and_nothing_is_shown(proxy: ProxyProcess) -> None:
    wrong = "not-the-admin-key"
    with chromium() as browser:
        browser.open(f"{proxy.url}/ui/#key={wrong}")
        browser.wait_for("the refusal", "return document.body.dataset.state === 'refused'")
        # A load enters the resource timing once its body is read, after the page saw its 401.
        browser.wait_for(
            "the refused read timed",
            "return performance.getEntriesByType('resource')"
            ".some((e) => e.name.includes('/admin/'))",
        )
        shown = browser.run(
            "return {text: document.querySelector('#problem').innerText,"
            " live: document.querySelector('#live').hidden,"
            " rows: document.querySelectorAll('#live tbody tr').length,"
            " fetched: performance.getEntriesByType('resource').map((e) => e.name)};"
        )
        errors = browser.first_console_errors("the refused reads")
    assert "401" in shown["text"] and shown["live"] is True and shown["rows"] == 0
    # The key went out as a header only: in no address the page asked for, and in no log line.
    admin = [url for url in shown["fetched"] if "/admin/" in url]
    assert admin and not [url for url in shown["fetched"] if wrong in url]
    assert wrong not in proxy.log_path.read_text()
    # The browser reports each refused read as a failed load; nothing else went wrong.
    assert all(e["source"] == "network" and "401" in e["message"] for e in errors)


SPECULATION = """
const rows = [...document.querySelectorAll('#backends tbody tr')];
return rows.length === arguments[0] &&
  rows.map((r) => [r.dataset.backend, r.querySelector('td.c-spec').innerText]);
"""


def test_each_backend_is_shown_with_its_own_speculative_type(tmp_path: Path) -> None:
    """A pool of three types (simulated): each row names its backend's type, and the draft
    model's file where it has one."""
    profiles = [
        {"name": "off"},
        {"name": "min", "spec_type": "ngram-mod", "draft_n_max": 8},
        {"name": "max", "spec_type": "draft-simple", "draft_model": "/models/small-draft.gguf",
         "draft_n_max": 16},
    ]  # fmt: skip
    model = simulator_model(profiles=profiles, time_scale=50.0)
    with running_proxy(proxy_config([model]), tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 3})
        with chromium() as browser:
            browser.open(f"{proxy.url}/ui/#key={ADMIN_KEY}")
            browser.wait_for("the page live", "return document.body.dataset.state === 'live'")
            shown = browser.wait_for("the three backends", SPECULATION, 3)
            errors = browser.console_errors()
    assert sorted(map(tuple, shown)) == [
        (f"{MODEL}/max", "draft-simple (small-draft.gguf)"),
        (f"{MODEL}/min", "ngram-mod"),
        (f"{MODEL}/off", "none"),
    ]
    assert errors == [], errors


def test_a_failed_save_of_what_was_learned_shows_as_a_warning(tmp_path: Path) -> None:
    """The learned file's directory goes away under a running proxy: each save fails, and the
    page says so above everything else until one succeeds (the admin feed it reads,
    /admin/depths, carries the warning)."""
    state_dir = tmp_path / "state"
    routing = {"learned_file": str(state_dir / "learned.json"), "state_save_interval_s": 0.2}
    model = simulator_model(draft_control="per-request", time_scale=50.0)
    with running_proxy(proxy_config([model], routing=routing), tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        with chromium() as browser:
            browser.open(f"{proxy.url}/ui/#key={ADMIN_KEY}")
            browser.wait_for("the page live", "return document.body.dataset.state === 'live'")
            assert browser.run("return document.querySelector('#warnings').hidden") is True
            deadline = time.monotonic() + 30
            while not (state_dir / "learned.json").exists():  # saved once, then it goes
                assert time.monotonic() < deadline, proxy.tail()
                time.sleep(0.05)
            # Moved away in one step: a save every 0.2 s could refill it between an unlink and
            # an rmdir ("Directory not empty").
            state_dir.rename(tmp_path / "state-gone")
            state_dir.write_text("a file where the directory was: every save fails now\n")
            warning = browser.wait_for(
                "the warning shown",
                "const w = document.querySelector('#warnings');"
                "return !w.hidden && w.querySelector('li').innerText;",
            )
            errors = browser.console_errors()
    assert warning.startswith(f"the learned statistics could not be saved to {state_dir}/")
    assert errors == [], errors


SOLO = "solo"  # one process with one slot: what `mtp-proxy init` writes for one GPU
CODE = "def area(r):\n    return 3.14159 * r * r\n\nclass Shape:\n    pass\n" * 40
DRAFTING_SHOT = REPO / "build" / "ui" / "drafting-answer.png"

DRAFTING = """
const block = document.querySelector(`#drafting .verdict-block[data-backend='${arguments[0]}']`);
if (!block) return null;
const speedups = [...block.querySelectorAll('td.c-speedup')].map((c) => c.dataset.speedup);
return {verdict: block.querySelector('.verdict').innerText, speedups,
        verdicts: [...block.querySelectorAll('td.c-verdict')].map((c) => c.innerText),
        loads: [...block.querySelectorAll('tbody tr')].map((r) => r.cells[0].innerText)};
"""
DEPTH_NOW = """
const c = document.querySelector(`#depths .card[data-backend='${arguments[0]}']`);
return c && c.dataset.depthNow !== '' &&
  {depth: c.dataset.depthNow, source: c.dataset.depthSource,
   big: c.querySelector('.big').innerText, words: c.querySelector('.now-source').innerText};
"""


def mixed_burst(url: str) -> list[Sent]:
    """Short chats and code prompts at once, streamed or not, under a client's own model name
    (Claude Code's), then the one-slot model's requests one after another."""
    bodies = []
    for i in range(8):
        text = CODE + f"# step {i}" if i % 2 else f"a short question, number {i}"
        body = body_for("chat", stream=i % 3 == 0, text=text, max_tokens=24)
        bodies.append({**body, "model": "claude-sonnet-4-5" if i % 4 == 0 else MODEL})
    with ThreadPoolExecutor(4) as pool:
        sent = list(pool.map(lambda body: send(url, "chat", body), bodies))
    # max alone: learned at load 1, while off was learned only beside others in the burst.
    pinned = {"X-MTP-Profile": "max"}
    sent.append(send(url, "chat", body_for("chat", stream=False, text="alone"), headers=pinned))
    for stream in (False, True):
        sent.append(send(url, "chat", {**body_for("chat", stream=stream), "model": SOLO}))
    assert {s.status for s in sent} == {200}, sent
    return sent


def test_the_page_answers_whether_drafting_pays_from_the_first_minute(tmp_path: Path) -> None:
    """A fresh demo and a one-slot process: after one mixed burst the page says, per load, what
    the start-up calibration measured and its verdict with a speedup figure; the one-slot
    process's depth now; the template pill's words; the client's model name beside the
    served one."""
    demo = simulator_model(draft_control="per-request", time_scale=50.0, slots=4)
    solo = simulator_model(SOLO, draft_control="per-request", time_scale=50.0, slots=1)
    config = proxy_config([demo, solo], routing={"clock_scale": 50.0, "seed": 1})
    config["model_names"] = {"patterns": {"claude-*": MODEL}}
    with running_proxy(config, tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 1, SOLO: 1})
        sent = mixed_burst(proxy.url)
        with chromium() as browser:
            browser.open(f"{proxy.url}/ui/#key={ADMIN_KEY}")
            browser.wait_for("the page live", "return document.body.dataset.state === 'live'")
            demo_answer = browser.wait_for("the demo's verdict", DRAFTING, f"{MODEL}/one-process")
            solo_answer = browser.wait_for("the one-slot verdict", DRAFTING, f"{SOLO}/one-process")
            depth_now = browser.wait_for("the one-slot depth now", DEPTH_NOW, f"{SOLO}/one-process")
            pills = browser.run(
                "return [...document.querySelectorAll('#backends td.c-template')].map((c) =>"
                "  [c.dataset.lateSystem, c.innerText, c.querySelector('.pill').className]);"
            )
            claude = sent[0]  # sent as claude-sonnet-4-5 (the burst's first)
            model_cell = browser.wait_for(
                "the client's model name",
                "const r = document.querySelector(`#requests tr[data-id='${arguments[0]}']`);"
                "return r && r.querySelector('td.c-model').innerText;",
                claude.request_id,
            )
            widths = browser.run(
                "return [...document.querySelectorAll('#live section')]"
                ".map((s) => [s.id, s.scrollWidth, s.clientWidth]);"
            )
            learned_rows = browser.wait_for(
                "the learned table",
                "const rows = [...document.querySelectorAll('#learned tr[data-class]')];"
                "return rows.length && rows.map((r) => [r.dataset.class,"
                "  [...r.querySelectorAll('td[data-level]')].map((c) => c.dataset.level)]);",
            )
            browser.full_height()
            png = browser.screenshot(DRAFTING_SHOT)
            errors = browser.console_errors()
    # The calibration's verdict per load, each with its speedup figure, both sides of one load.
    assert demo_answer["loads"] == ["alone", "2-3 decoding", "4+ decoding"], demo_answer
    assert len(demo_answer["speedups"]) == 3 and all(float(x) > 0 for x in demo_answer["speedups"])
    for figure, verdict in zip(demo_answer["speedups"], demo_answer["verdicts"], strict=True):
        assert verdict.startswith("drafting pays" if float(figure) > 1 else "off wins"), verdict
    assert "alone, drafting pays: depth 3 decodes" in demo_answer["verdict"], demo_answer
    assert solo_answer["loads"] == ["alone"] and float(solo_answer["speedups"][0]) > 0
    # The one-slot process is never busy: its depth now is its last request's.
    assert depth_now["source"] == "last" and depth_now["depth"] in {"0", "2", "3"}, depth_now
    assert depth_now["big"] == depth_now["depth"] and "its last request" in depth_now["words"]
    # setup-b's template refuses late system messages; the proxy mends them: a neutral pill.
    assert pills and all(found == "refused" for found, _, _ in pills), pills
    assert all(
        text == "mended" and "neutral" in cls and "warn" not in cls for _, text, cls in pills
    )
    # Nothing is wider than the 1400 px window: no section scrolls sideways.
    assert all(scroll <= client for _, scroll, client in widths), widths
    # The learned table sets side by side only what was measured at one load.
    for label, levels in learned_rows:
        assert len(set(levels)) == 1 and label.endswith(f"@{levels[0]}"), (label, levels)
    assert any(label == "<4k/prose@1" for label, _ in learned_rows), learned_rows
    assert model_cell.splitlines() == ["claude-sonnet-4-5", f"served by {MODEL}"], model_cell
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert errors == [], errors
