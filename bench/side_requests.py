"""What an agent's side requests cost its prompt cache, and what a slot kept for them saves.

A Claude-Code-like session is replayed through `mtp-proxy serve` in front of a real
llama-server on a tiny model: main turns with a growing context (the agent's system prompt and
tools, then a tool result more at each turn, x-claude-code-session-id), and between two turns
side requests (a claude-haiku-* title request, a toolless haiku call with a prompt of its own,
and one under the agent's own system prompt). Per main turn, the
backend's own figures: `timings.prompt_n`, the prompt tokens it processed, against
`timings.cache_n`, the ones it reused (kept in the slot, or restored from host memory). A turn
whose prefix stayed in its slot processes only what the turn added; one whose slot a side
request took processes it again whole (or restores it from --cache-ram, host memory). The same
replay, one llama-server set-up after the other:

- `-np 1 --cache-ram 0`: the only slot, nothing saved to host memory;
- `-np 1` (--cache-ram 8192 MiB, the default): saved and loaded back;
- `-np 2 --kv-unified` and `[side_requests] slot = 1`: on unified KV llama-server saves each
  idle slot to host memory and clears it when a task starts (--cache-idle-slots, its default);
- `-np 2 --kv-unified --no-cache-idle-slots`: two slots, llama-server chooses (prompt
  similarity, then the oldest);
- the same and `[side_requests] slot = 1` (what init writes): side requests to slot 1, the
  rest to 0.

    python -m bench.side_requests \\
        --llama-server "$(bash scripts/build-llama-server.sh | tail -n 1)" \\
        --model "$(bash scripts/fetch-models.sh smollm2-135m | tail -n 1)" [--turns 8] [--json F]

A few minutes on two cores (-t 1).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.processes import running_proxy
from proxy.workloads import texts

CONTEXT = 16384
SESSION = {"x-claude-code-session-id": "bench-agent-session"}
SYSTEM_CHARS = 3000
RESULT_CHARS = 600  # a tool result of a few hundred tokens at each turn


@dataclass(frozen=True)
class SetUp:
    name: str
    args: list[str]
    side_slot: int | None


TWO = ["-np", "2", "--kv-unified"]
KEEP_IDLE = [*TWO, "--no-cache-idle-slots"]
SETUPS = (
    SetUp("-np 1 --cache-ram 0", ["-np", "1", "--cache-ram", "0"], None),
    SetUp("-np 1 (--cache-ram 8192)", ["-np", "1"], None),
    SetUp("-np 2 --kv-unified, side slot 1", TWO, 1),
    SetUp("-np 2 --kv-unified --no-cache-idle-slots", KEEP_IDLE, None),
    SetUp("-np 2 --kv-unified --no-cache-idle-slots, side slot 1", KEEP_IDLE, 1),
)


@dataclass
class Turn:
    prompt_n: int  # prompt tokens processed
    cache_n: int  # prompt tokens reused from the slot (or restored)
    prompt_ms: float
    side_n: int = 0  # prompt tokens the side requests after it processed


def main_turn(k: int, rng: random.Random, system: str) -> dict[str, Any]:
    """The agent's k-th turn: the same prefix as the turn before, one tool exchange more."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Fix the failing test in the cache module."},
    ]
    for i in range(k):
        messages.append({"role": "assistant", "content": f"Step {i}: reading the next file."})
        messages.append(
            {"role": "user", "content": "Tool result:\n" + texts.code_file(rng, RESULT_CHARS)}
        )
    return {
        "model": "claude-sonnet-4-5",
        "messages": messages,
        "tools": texts.tools("chat"),
        "max_tokens": 8,
        "temperature": 0,
    }


def side_requests(k: int, system: str) -> list[dict[str, Any]]:
    """What an agent sends between two turns: a title, a haiku call with a prompt of its own,
    and a haiku call under the agent's own system prompt (another conversation: llama-server's
    choice by prompt similarity puts it in the agent's slot, and it keeps only the system
    prompt there). A side request that carries the whole conversation would extend the agent's
    prefix instead: it costs its own prompt, not the next turn's."""
    return [
        _haiku("Write a 3-7 word title for this conversation.",
               f"Fix the failing test in the cache module (turn {k}).", 32),
        _haiku("Answer yes or no: does this message start a new topic?",
               f"Now look at the next failure, number {k}.", 8),
        _haiku(system, f"Which files does step {k} touch? One line.", 16),
    ]  # fmt: skip


def _haiku(system: str, user: str, max_tokens: int) -> dict[str, Any]:
    """A greedy claude-haiku-* request, as Claude Code's side calls are named."""
    return {
        "model": "claude-haiku-4-5-20251001",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def proxy_config(setup: SetUp, binary: str, model: Path) -> dict[str, Any]:
    args = ["-c", str(CONTEXT), "-t", "1", "-tb", "1", *setup.args]
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 0},
        "log": {"level": "info", "format": "json"},
        "routing": {"calibrate": "off"},
        "models": [
            {
                "name": "tiny",
                "backend": "llama-server",
                "binary": binary,
                "model_path": str(model),
                "args": args,
                "profiles": [{"name": "off"}],
            }
        ],
        "model_names": {"default": "tiny"},
    }
    if setup.side_slot is not None:
        config["side_requests"] = {"slot": setup.side_slot}
    return config


def replay(setup: SetUp, binary: str, model: Path, turns: int, workdir: Path) -> list[Turn]:
    """The session through a proxy of this set-up: every main turn's figures."""
    rng_system = random.Random(7)
    system = texts.agent_system(rng_system, "claude-code")[:SYSTEM_CHARS]
    out = []
    with running_proxy(proxy_config(setup, binary, model), workdir) as proxy:
        proxy.wait_healthy(timeout=120)
        for k in range(turns):
            turn = main_turn(k, random.Random(11), system)
            timings = post(proxy.url, turn, SESSION)["timings"]
            out.append(Turn(timings["prompt_n"], timings.get("cache_n", 0), timings["prompt_ms"]))
            side_n = 0
            for side in side_requests(k, system):
                side_n += post(proxy.url, side, SESSION)["timings"]["prompt_n"]
            out[-1].side_n = side_n
    return out


def summary(name: str, turns: list[Turn], base: list[Turn] | None) -> dict[str, Any]:
    later = turns[1:]  # the first turn processes its whole prompt in every set-up
    processed = sum(t.prompt_n for t in later)
    row = {
        "setup": name,
        "turns": len(later),
        "processed_per_turn": statistics.fmean(t.prompt_n for t in later),
        "reused_per_turn": statistics.fmean(t.cache_n for t in later),
        "prompt_ms_per_turn": statistics.fmean(t.prompt_ms for t in later),
        "side_per_turn": statistics.fmean(t.side_n for t in later),
        "processed_total": processed,
    }
    if base is not None:
        row["vs_kept_slot"] = processed / max(sum(t.prompt_n for t in base[1:]), 1)
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| llama-server set-up | prompt tokens processed per main turn | reused per turn | "
        "prompt ms per turn | processed, x the kept slot's | side requests' tokens per turn |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setup']} | {r['processed_per_turn']:.0f} | {r['reused_per_turn']:.0f} | "
            f"{r['prompt_ms_per_turn']:.0f} | {r.get('vs_kept_slot', 1.0):.1f}x | "
            f"{r['side_per_turn']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", required=True, help="the patched llama-server")
    parser.add_argument("--model", type=Path, required=True, help="a small chat GGUF")
    parser.add_argument("--turns", type=int, default=8, help="main turns (8)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    measured: dict[str, list[Turn]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-side-") as folder:
        for n, setup in enumerate(SETUPS):
            print(f"replaying on {setup.name} ...", file=sys.stderr, flush=True)
            workdir = Path(folder) / str(n)
            workdir.mkdir()
            measured[setup.name] = replay(setup, args.llama_server, args.model, args.turns, workdir)
    kept = measured[SETUPS[-1].name]
    rows = [summary(name, turns, kept) for name, turns in measured.items()]
    print(markdown(rows))
    if args.json is not None:
        data = {"rows": rows, "turns": {k: [asdict(t) for t in v] for k, v in measured.items()}}
        args.json.write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
