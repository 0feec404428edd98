"""How much of a real agent's prompt llama-server's prefix cache keeps, through the proxy.

A real Claude Code runs against `mtp-proxy serve` in front of a real llama-server on a tiny
hybrid (qwen35: gated delta net + attention, the Qwen3.5/3.6 family) model with the real
Qwen3.5 chat template, which refuses Claude Code's mid-conversation system turns unless the
proxy rewrites them ([compat] system_turns, in place). Two figures, from the proxy's own log
line of each request (`context_tokens` = the prompt, `cached_tokens` = what the backend reused):

- **turns**: one session, turn after turn (`claude -p`, then `claude -p --continue`, with a
  `git init` between two turns so that Claude Code appends an "# Environment update" system
  turn). Per request: its cached tokens against the previous request's prompt. In place, every
  earlier prompt byte stays, so the cache keeps the previous prompt up to a context checkpoint:
  a hybrid model cannot roll its recurrent state back to any position, only to a checkpoint
  (llama-server makes them at the last user turn's start and a few tokens before each prompt's
  end), and the Qwen3.5 template drops the `<think>` opening of the previous answer once a new
  user query follows it.
- **sessions**: two new sessions in the same directory with different first prompts, with
  [compat] session_prefix off and on: the prompt tokens the second session processes again.
  Claude Code's billing header carries digits derived from the first prompt, right after the
  tools and before its ~40k-token agent prompt.

    python -m tests.support.tinygguf qwen35-long.gguf --arch qwen35 --ctx 131072 --bigram \\
        --mtp identity
    templates=$(bash scripts/build-llama-server.sh --templates | tail -n 1)
    python -m bench.agent_cache --claude .clients/node/node_modules/.bin/claude \\
        --llama-server "$(bash scripts/build-llama-server.sh | tail -n 1)" \\
        --template "$templates/Qwen3.5-4B.jinja" --model qwen35-long.gguf [--json figures.json]

About two minutes on two cores (every new session prefills ~40k tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.processes import ProxyProcess, running_proxy

CONTEXT = 131072
END_OF_TURN = 322  # <|im_end|> in the tiny models' vocabulary (tests/support/tinygguf)
REASONING_BUDGET = 8
DEAD_PROXY = "http://127.0.0.1:9"
KEY = "sk-local-bench"
RUN_TIMEOUT_S = 300.0
# A second turn of a few thousand tokens: a rewrite that changed the first system turn would
# have to prefill it again at every later turn (the first system turn comes before it).
LONG_PROMPT = "Summarise these notes:\n" + "\n".join(
    f"{n}. the build step {n} copies the cache entry and checks its hash" for n in range(120)
)


@dataclass(frozen=True)
class Setup:
    """What the measurement runs: the client and the server."""

    claude: str
    llama_server: str
    template: Path
    model: Path


@dataclass
class Request:
    """One generation request of the session, as the proxy logged it."""

    step: str
    status: int
    context_tokens: int
    cached_tokens: int
    previous_context: int | None = None  # the request before it, in the same session

    @property
    def prefilled(self) -> int:
        return self.context_tokens - self.cached_tokens

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "prefilled": self.prefilled}


def server_args(setup: Setup, end_bias: int = 7) -> list[str]:
    """One slot (the session's), the real template, thinking closed after a few tokens, and an
    end-of-turn bias that ends the tiny model's answers after tens of tokens (100: at once, an
    answer with no visible text)."""
    return [
        "-c", str(CONTEXT), "-np", "1", "-t", "1", "--logit-bias", f"{END_OF_TURN}+{end_bias}",
        "--jinja", "--chat-template-file", str(setup.template),
        "--reasoning-budget", str(REASONING_BUDGET),
    ]  # fmt: skip


def proxy_config(setup: Setup, *, session_prefix: bool, end_bias: int = 7) -> dict[str, Any]:
    model = {
        "name": "tiny",
        "backend": "llama-server",
        "draft_control": "per-process",
        "binary": setup.llama_server,
        "model_path": str(setup.model),
        "args": server_args(setup, end_bias),
        "profiles": [{"name": "off"}],
    }
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "log": {"level": "info", "format": "json"},
        "supervisor": {"stagger_s": 0.0, "health_interval_s": 0.5, "ready_timeout_s": 60.0},
        "model_names": {"default": "tiny"},
        "compat": {"system_turns": "auto", "session_prefix": session_prefix},
        "models": [model],
    }


def claude_env(home: Path, proxy: ProxyProcess) -> dict[str, str]:
    """A fresh HOME, telemetry off, nothing but the proxy reachable."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        HTTP_PROXY=DEAD_PROXY,
        HTTPS_PROXY=DEAD_PROXY,
        ALL_PROXY=DEAD_PROXY,
        http_proxy=DEAD_PROXY,
        https_proxy=DEAD_PROXY,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        CI="true",
        ANTHROPIC_BASE_URL=proxy.url,
        ANTHROPIC_API_KEY=KEY,
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    return env


def settled_log(proxy: ProxyProcess, since: int) -> list[dict[str, Any]]:
    """The proxy's log lines after line `since`, once every answered request has its line
    (scraping /metrics runs the deferred bookkeeping)."""
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        response.read()
    time.sleep(0.1)
    return proxy.log_lines()[since:]


def logged_requests(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The generation requests among the proxy's log lines."""
    return [x for x in lines if x.get("event") == "request" and x.get("api") is not None]


# The lines of llama-server's log that say which prefix a request reused and why: a failed check
# reads them instead of guessing.
_CACHE_WORDS = ("context checkpoint", "full prompt re-processing", "selected slot", "prompt cache")


def cache_events(lines: list[dict[str, Any]]) -> list[str]:
    """llama-server's lines about its prefix cache among the proxy's log lines (the proxy
    relays them into its own log)."""
    events = [str(x.get("event", "")) for x in lines if x.get("backend")]
    return [e[e.find("slot") :] for e in events if any(w in e for w in _CACHE_WORDS)]


class Session:
    """Claude Code in one directory (one HOME), run turn after turn through one proxy."""

    def __init__(self, setup: Setup, proxy: ProxyProcess, home: Path) -> None:
        self.setup, self.proxy, self.home = setup, proxy, home
        self.work = home / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.requests: list[Request] = []
        self.exits: list[int] = []
        self.cache_events: list[str] = []  # llama-server's own account of its cache, per step

    def turn(self, step: str, prompt: str, *, resume: bool) -> list[Request]:
        """`claude -p PROMPT` (`--continue`: the same session); its requests, as logged."""
        before = len(self.proxy.log_lines())
        argv = [self.setup.claude, "-p", *(["--continue"] if resume else []), prompt]
        done = subprocess.run(
            argv,
            cwd=self.work,
            env=claude_env(self.home, self.proxy),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        self.exits.append(done.returncode)
        lines = settled_log(self.proxy, before)
        self.cache_events += [f"{step}: {event}" for event in cache_events(lines)]
        new = []
        for line in logged_requests(lines):
            previous = self.requests[-1].context_tokens if self.requests else None
            request = Request(
                step=step,
                status=int(line["status"]),
                context_tokens=int(line.get("context_tokens") or 0),
                cached_tokens=int(line.get("cached_tokens") or 0),
                previous_context=previous,
            )
            self.requests.append(request)
            new.append(request)
        return new

    def shell(self, *argv: str) -> None:
        subprocess.run(argv, cwd=self.work, check=True, capture_output=True, timeout=60)


def measure_turns(setup: Setup, workdir: Path) -> dict[str, Any]:
    """One session of four turns (the second a long prompt), the environment changed (git init)
    before the third."""
    with running_proxy(proxy_config(setup, session_prefix=True), workdir / "proxy") as proxy:
        session = Session(setup, proxy, workdir / "home")
        session.turn("1 say hi", "say hi", resume=False)
        session.turn("2 long prompt", LONG_PROMPT, resume=True)
        session.shell("git", "init", "-q")
        session.turn("3 after git init", "what changed?", resume=True)
        session.turn("4 thanks", "thanks", resume=True)
    return {
        "exits": session.exits,
        "requests": [r.row() for r in session.requests],
        "cache_events": session.cache_events,
    }


def measure_resend(setup: Setup, workdir: Path) -> dict[str, Any]:
    """One `claude -p` whose answers end at once: Claude Code sends its request again, with its
    last user message edited ("say hi" becomes "say hi\n" and a reminder to answer visibly)."""
    config = proxy_config(setup, session_prefix=True, end_bias=100)
    with running_proxy(config, workdir / "proxy") as proxy:
        session = Session(setup, proxy, workdir / "home")
        session.turn("say hi", "say hi", resume=False)
    return {"exits": session.exits, "requests": [r.row() for r in session.requests]}


def measure_sessions(setup: Setup, workdir: Path, *, session_prefix: bool) -> dict[str, Any]:
    """Two new sessions in one directory, different first prompts: what the second prefills."""
    config = proxy_config(setup, session_prefix=session_prefix)
    tag = "on" if session_prefix else "off"
    with running_proxy(config, workdir / f"proxy-{tag}") as proxy:
        home = workdir / f"home-{tag}"
        first = Session(setup, proxy, home).turn("session A", "say hi", resume=False)
        second = Session(setup, proxy, home).turn("session B", "tell me a joke", resume=False)
    return {
        "session_prefix": session_prefix,
        "first": [r.row() for r in first],
        "second": [r.row() for r in second],
    }


def markdown(figures: dict[str, Any]) -> str:
    rows = [
        "| request | status | prompt | cached | previous prompt | cached / previous | prefilled |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in figures["turns"]["requests"]:
        prev = r["previous_context"]
        shown = f"{prev:,}" if prev else "-"
        share = f"{r['cached_tokens'] / prev:.1%}" if prev else "-"
        rows.append(
            f"| {r['step']} | {r['status']} | {r['context_tokens']:,} | {r['cached_tokens']:,} "
            f"| {shown} | {share} | {r['prefilled']:,} |"
        )
    rows += ["", "| session_prefix | session B prompt | cached | prefilled again |"]
    rows += ["|---|---|---|---|"]
    for s in figures["sessions"]:
        b = s["second"][0]
        rows.append(
            f"| {'on' if s['session_prefix'] else 'off'} | {b['context_tokens']:,} "
            f"| {b['cached_tokens']:,} | {b['prefilled']:,} |"
        )
    return "\n".join(rows)


def measure(setup: Setup, workdir: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    progress("turns of one session")
    turns = measure_turns(setup, workdir / "turns")
    sessions = []
    for session_prefix in (False, True):
        progress(f"two sessions, session_prefix {'on' if session_prefix else 'off'}")
        sessions.append(
            measure_sessions(setup, workdir / "sessions", session_prefix=session_prefix)
        )
    return {"turns": turns, "sessions": sessions}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_cache", description=__doc__)
    parser.add_argument("--claude", required=True, help="the claude executable")
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--template", type=Path, required=True, help="Qwen3.5-4B.jinja")
    parser.add_argument("--model", type=Path, required=True, help="a tiny qwen35 GGUF")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    claude = str(Path(args.claude).resolve()) if os.sep in args.claude else args.claude
    setup = Setup(claude, args.llama_server, args.template.resolve(), args.model.resolve())
    with tempfile.TemporaryDirectory(prefix="agent-cache-") as tmp:
        figures = measure(setup, Path(tmp), lambda what: print(f"... {what}", file=sys.stderr))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(markdown(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
