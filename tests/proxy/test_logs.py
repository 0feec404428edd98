"""Logs of a real proxy process: one canonical JSON line per request, no secret ever written,
console rendering (asked for, and on a terminal), and the level taken from the config."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from proxy.observability.logs import REDACTED, REQUEST_FIELDS
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    free_port,
    proxy_config,
    running_proxy,
    simulator_model,
)
from tests.support.traffic import MODEL, Sent, body_for, send, standard_mix, wait_all_ready

CLIENT_KEY = "sk-client-7f3a9c2e51"
WRONG_KEY = "sk-wrong-0b8d4e6f27"
CLASS = "<4k/prose"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Logged:
    proxy: ProxyProcess
    sent: list[Sent]
    admin_as_model: Sent  # a request naming the admin key as its model (the 404 repeats it)
    text: str  # the whole log file, read after the proxy stopped

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text.splitlines()]

    def requests(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for line in self.lines():
            if line["event"] == "request":
                assert line["request_id"] not in found, f"two lines for {line['request_id']}"
                found[line["request_id"]] = line
        return found


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Logged]:
    """A JSON-logging proxy at level info with client keys, after traffic that used them."""
    config = proxy_config(server={"api_keys": [CLIENT_KEY]})
    assert config["log"] == {"level": "info", "format": "json"}
    with running_proxy(config, tmp_path_factory.mktemp("logs-proxy")) as proxy:
        wait_all_ready(proxy)
        bearer = {"Authorization": f"Bearer {CLIENT_KEY}"}
        sent = standard_mix(proxy.url, headers=bearer)
        anthropic_key = {"x-api-key": CLIENT_KEY, "X-MTP-Profile": "max"}
        sent.append(
            send(proxy.url, "messages", body_for("messages", stream=True), headers=anthropic_key)
        )
        wrong = {"Authorization": f"Bearer {WRONG_KEY}"}
        sent.append(send(proxy.url, "chat", body_for("chat", stream=False), headers=wrong))
        admin_as_model = send(
            proxy.url,
            "chat",
            {**body_for("chat", stream=False), "model": ADMIN_KEY},
            headers=bearer,
        )
        oversized = b"X-Long: " + b"a" * 9000 + b"\r\n"  # refused by aiohttp's parser
        assert raw_http(proxy.port, oversized).split(b" ", 2)[1] == b"400"
        argv = ["status", "--url", proxy.url, "--admin-key", ADMIN_KEY]
        status = subprocess.run(
            [sys.executable, "-m", "proxy.cli", *argv],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
    yield Logged(proxy, sent, admin_as_model, proxy.log_path.read_text())


def raw_http(port: int, header: bytes) -> bytes:
    """One request with an extra raw header line; the answer's bytes."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + header + b"Connection: close\r\n\r\n{}")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_the_traffic_was_answered(logged: Logged) -> None:
    statuses = [s.status for s in logged.sent]
    assert statuses.count(200) == 19 and sorted(set(statuses)) == [200, 400, 401, 404]
    assert logged.admin_as_model.status == 404


def test_every_line_is_json_with_level_and_time(logged: Logged) -> None:
    lines = logged.text.splitlines()
    assert len(lines) > 20
    for raw in lines:
        line = json.loads(raw)  # the journal holds nothing else, backend output included
        assert line["level"] in {"info", "warning", "error"}, line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", line["timestamp"]), line


def test_one_canonical_line_per_request(logged: Logged) -> None:
    requests = logged.requests()
    everything = [*logged.sent, logged.admin_as_model]
    generation = {rid for rid, line in requests.items() if line["api"] is not None}
    assert generation == {s.request_id for s in everything}
    # Nothing else at level info: the readiness polls of /health (and Prometheus' scrapes) are
    # debug lines, and so are the status command's successful admin reads (the live page polls
    # them every 1.5 s; a refused one is at info).
    others = {line["path"].split("?")[0] for rid, line in requests.items() if rid not in generation}
    assert others == set(), others
    for line in requests.values():
        # Every request line has every field, in one order, whatever happened to the request.
        assert list(line)[: len(REQUEST_FIELDS) + 1] == ["event", *REQUEST_FIELDS]
        assert isinstance(line["duration_s"], float) and 0 <= line["duration_s"] < 30


def test_answered_requests_log_route_tokens_acceptance_and_timings(logged: Logged) -> None:
    requests = logged.requests()
    for sent in (s for s in logged.sent if s.status == 200):
        line = requests[sent.request_id]
        assert (line["model"], line["api"], line["status"]) == (MODEL, sent.api, 200)
        assert (line["profile"], line["reason"]) == (sent.profile, sent.reason)
        assert line["backend"] == f"{MODEL}/{sent.profile}"
        assert (line["request_class"], line["load_level"]) == (CLASS, "any")  # a pool
        assert line["stream"] is sent.stream
        assert line["output_tokens"] == sent.output_tokens
        assert line["error"] is None
        if sent.api == "messages":
            continue  # no timings: tokens from usage; acceptance is measured after the answer
        assert line["context_tokens"] == sent.context_tokens
        assert line["decode_tok_s"] > 0
        assert (line["draft_n"] or 0, line["draft_accepted"] or 0) == (
            sent.draft_n,
            sent.draft_accepted,
        )
        if sent.draft_n:
            assert line["acceptance"] == pytest.approx(sent.draft_accepted / sent.draft_n)
        else:
            assert line["acceptance"] is None
        if sent.stream:
            assert 0 < line["ttft_s"] <= line["duration_s"]


def test_refused_requests_are_logged_with_their_status_and_why(logged: Logged) -> None:
    requests = logged.requests()
    refused = {s.status: requests[s.request_id] for s in logged.sent if s.status != 200}
    assert set(refused) == {400, 401, 404}
    assert "JSON object" in refused[400]["error"]
    assert "API key" in refused[401]["error"]
    assert "no-such-model" in refused[404]["error"]
    for status, line in refused.items():
        assert line["status"] == status and line["api"] == "chat"
        assert line["profile"] is None and line["output_tokens"] is None


def test_no_secret_reaches_the_log(logged: Logged) -> None:
    for secret in (CLIENT_KEY, WRONG_KEY, ADMIN_KEY):
        assert secret not in logged.text
    # The one place a key came back in a message (an unknown model named like the admin key):
    # redacted, the rest of the message kept.
    line = logged.requests()[logged.admin_as_model.request_id]
    assert line["error"] == f"model '{REDACTED}' does not exist"


def test_a_malformed_request_is_one_short_info_line(logged: Logged) -> None:
    # aiohttp would log it at ERROR with a traceback quoting the 9 kB header.
    (line,) = [line for line in logged.lines() if line.get("logger") == "aiohttp.server"]
    assert line["level"] == "info" and "exception" not in line
    assert line["event"].startswith("malformed HTTP request refused (400): Got more than")
    assert len(json.dumps(line)) < 500


def test_info_level_writes_no_debug_lines(logged: Logged) -> None:
    assert all(line["level"] != "debug" for line in logged.lines())
    assert '"request_received"' not in logged.text  # the per-request debug line


# --- console rendering and the debug level -------------------------------------------------


def console_config(fmt: str, level: str) -> dict[str, Any]:
    config = proxy_config(
        [simulator_model(profiles=[{"name": "off"}])], server={"port": free_port()}
    )
    config["log"] = {"level": level, "format": fmt}
    return config


def serve_argv(config: dict[str, Any], workdir: Path) -> list[str]:
    path = workdir / "config.toml"
    path.write_text(tomli_w.dumps(config))
    return [sys.executable, "-m", "proxy.cli", "serve", "--config", str(path)]


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the proxy exited"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"proxy at {url} not healthy within {timeout}s")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(30)


def test_console_format_and_debug_level(tmp_path: Path) -> None:
    config = console_config("console", "debug")
    url = f"http://127.0.0.1:{config['server']['port']}"
    log_path = tmp_path / "proxy.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            serve_argv(config, tmp_path), stdout=log_file, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
        )  # fmt: skip
    try:
        wait_healthy(url, process)
        answer = send(url, "chat", body_for("chat", stream=False))
        assert answer.status == 200
    finally:
        stop(process)
    text = log_path.read_text()
    lines = text.splitlines()
    assert not ANSI.search(text)  # console layout, but no colour codes in a file
    for line in lines:
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)
    listening = next(line for line in lines if " listening " in line)
    assert "[info" in listening and f"port={config['server']['port']}" in listening
    mine = [line for line in lines if f"request_id={answer.request_id}" in line]
    # Debug, as configured: the request's debug line comes before its canonical line.
    assert len(mine) == 2
    assert "[debug" in mine[0] and " request_received " in mine[0]
    assert "[info" in mine[1] and " request " in mine[1]
    assert "status=200" in mine[1] and "profile=off" in mine[1]
    # The console leaves out what is empty (a request line has ~20 fields, most of them null).
    assert "=None" not in text
    # The readiness polls are there, at debug.
    polls = [line for line in lines if " request " in line and "path=/health" in line]
    assert polls and all("[debug" in line for line in polls)


def test_auto_format_renders_for_a_terminal(tmp_path: Path) -> None:
    config = console_config("auto", "info")
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        serve_argv(config, tmp_path), stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
    )  # fmt: skip
    os.close(terminal)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while b"listening" not in seen and time.monotonic() < deadline:
            seen += read_available(controller)
        assert b"listening" in seen, seen.decode(errors="replace")
    finally:
        process.send_signal(signal.SIGTERM)
        while process.poll() is None:  # keep reading: a full terminal would block its writes
            seen += read_available(controller)
        os.close(controller)
    text = ANSI.sub("", seen.decode(errors="replace"))
    listening = next(line for line in text.splitlines() if " listening " in line)
    assert "[info" in listening and not listening.lstrip().startswith("{")
    assert ANSI.search(seen.decode(errors="replace"))  # colours on a terminal


def read_available(fd: int) -> bytes:
    ready, _, _ = select.select([fd], [], [], 0.2)
    if not ready:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the other end closed
        return b""
