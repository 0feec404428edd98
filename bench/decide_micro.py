"""Micro-benchmark of the decision path: parse + features + classify + decide.

    python -m bench.decide_micro [--rounds N] [--orjson] [--gc-tuned]

Targets: under 2 ms for a 100k-token agent prompt, under 100 us for a short chat.
The request builders are also used by the unit tests as realistic inputs.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from proxy.apis import Api
from proxy.config.routing import RoutingSettings
from proxy.routing.classes import RequestClass, bucket_labels
from proxy.routing.features import extract_features
from proxy.routing.policy import Candidate, decide
from proxy.routing.stats import LearnedStats
from proxy.routing.telemetry import Observation

_CODE_TEMPLATE = '''def {name}(items: list[int], limit: int = {n}) -> dict[str, int]:
    """Count how many {noun} stay under the limit."""
    result: dict[str, int] = {{}}
    for i, item in enumerate(items):
        if item > limit:
            continue
        key = f"{noun}-{{i % {m}}}"
        result[key] = result.get(key, 0) + item
    return result


class {cls}Store:
    def __init__(self, path: str) -> None:
        self.path = path
        self._cache: dict[str, bytes] = {{}}

    def load(self, key: str) -> bytes:
        if key not in self._cache:
            with open(self.path + "/" + key, "rb") as f:
                self._cache[key] = f.read()
        return self._cache[key]

'''
_NOUNS = ("orders", "users", "frames", "tokens", "rows", "events", "pages", "jobs")
_PROSE = (
    "The committee met on a grey morning to discuss the harvest and the state of the roads. "
    "Several members argued that the old bridge needed repair before winter, while others "
    "preferred to spend the money on the school. After a long debate they agreed to ask the "
    "county for help and to write a letter explaining the situation in plain words. "
)
AGENT_SYSTEM = (
    "You are an interactive coding agent running in the user's terminal. Use the tools to read "
    "files, edit files and run shell commands in the repository. Before editing a file, read it. "
    "Prefer small diffs, run the tests after each edit, and never commit without being asked. "
) * 20


def code_text(chars: int, seed: int = 0) -> str:
    """Plausible Python source of about ``chars`` characters."""
    rnd = random.Random(seed)
    parts: list[str] = []
    total = 0
    i = 0
    while total < chars:
        part = _CODE_TEMPLATE.format(
            name=f"count_{rnd.choice(_NOUNS)}_{i}",
            n=rnd.randint(10, 999),
            noun=rnd.choice(_NOUNS),
            m=rnd.randint(2, 9),
            cls=f"Blob{i}",
        )
        parts.append(part)
        total += len(part)
        i += 1
    return "".join(parts)[:chars]


def prose_text(chars: int) -> str:
    return (_PROSE * (chars // len(_PROSE) + 1))[:chars]


def _tool(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "input_schema": {
            "type": "object",
            "properties": {
                "file_path": {"type": "string", "description": "Absolute path of the file."},
                "content": {"type": "string", "description": "New content."},
            },
            "required": ["file_path"],
        },
    }


def agent_request(prompt_chars: int = 400_000, *, stream: bool = True) -> dict[str, Any]:
    """An Anthropic Messages request shaped like a coding agent's late turn."""
    tools = [_tool(n, f"{n} a file in the workspace. " * 8) for n in ("Read", "Write", "Edit")]
    tools += [_tool(f"Tool{i}", "A helper tool. " * 20) for i in range(12)]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Fix the failing test in store.py and explain the change."}
    ]
    size = len(AGENT_SYSTEM)
    turn = 0
    while size < prompt_chars:
        body = code_text(6000, seed=turn)
        call_id = f"toolu_{turn}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me read the next file."},
                    {
                        "type": "tool_use",
                        "id": call_id,
                        "name": "Read",
                        "input": {"file_path": f"/repo/src/mod_{turn}.py"},
                    },
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call_id, "content": body}],
            }
        )
        size += len(body) + 60
        turn += 1
    return {
        "model": "mtp-demo",
        "max_tokens": 4096,
        "stream": stream,
        "system": [{"type": "text", "text": AGENT_SYSTEM}],
        "tools": tools,
        "messages": messages,
    }


def chat_agent_request(prompt_chars: int = 400_000, turn_chars: int = 500) -> dict[str, Any]:
    """An OpenAI chat request of a coding agent with many small tool turns (walk-heavy)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": AGENT_SYSTEM},
        {"role": "user", "content": "Make the test suite pass."},
    ]
    size = len(AGENT_SYSTEM)
    turn = 0
    while size < prompt_chars:
        args = json.dumps({"path": f"src/m{turn}.py", "old": "x = 1", "new": "x = 2"})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{turn}",
                        "type": "function",
                        "function": {"name": "edit", "arguments": args},
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": f"c{turn}", "content": code_text(turn_chars, turn)}
        )
        size += turn_chars + len(args)
        turn += 1
    tools = [
        {
            "type": "function",
            "function": {
                "name": n,
                "description": "A tool. " * 30,
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
        for n in ("read", "edit", "bash", "grep", "glob")
    ]
    return {"model": "mtp-demo", "stream": True, "messages": messages, "tools": tools}


def short_chat() -> dict[str, Any]:
    return {
        "model": "mtp-demo",
        "stream": True,
        "max_tokens": 256,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hi! What is a good name for a grey cat?"},
        ],
    }


def _candidates() -> list[Candidate]:
    return [
        Candidate("mtp-demo/off", "off", True, 1, 4),
        Candidate("mtp-demo/min", "min", True, 0, 4),
        Candidate("mtp-demo/max", "max", True, 2, 4),
    ]


def _trained_stats(settings: RoutingSettings) -> LearnedStats:
    """Statistics with trusted estimates in every class, so decide() takes the learned path."""
    stats = LearnedStats(settings)
    for bucket in bucket_labels(settings.context_buckets):
        for kind in ("code", "prose"):
            cls = RequestClass(bucket, kind)
            for profile, speed in (("off", 38.0), ("min", 40.0), ("max", 55.0)):
                for _ in range(10):
                    obs = Observation(
                        "b", profile, cls, 9000, 0, 300, 200, 150, speed, 1.0, 1.0, 9.0, "timings"
                    )
                    stats.observe(cls, profile, obs)
    return stats


def _time(fn: Callable[[], object], rounds: int) -> list[float]:
    for _ in range(min(rounds, 50)):
        fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000.0)
    return samples


def _report(label: str, samples: list[float], target_us: float) -> None:
    samples.sort()
    mean = statistics.fmean(samples)
    p50 = samples[len(samples) // 2]
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    verdict = "OK" if p99 < target_us else ("mean OK" if mean < target_us else "OVER")
    print(
        f"{label:<44} mean {mean:9.1f} us  p50 {p50:9.1f} us  p99 {p99:9.1f} us  "
        f"target {target_us:7.0f} us  {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--orjson", action="store_true", help="also time orjson.loads if installed")
    parser.add_argument(
        "--gc-tuned",
        action="store_true",
        help="gc.freeze() + gen0 threshold 50000, as a server could do after start-up: the p99 "
        "of big bodies is otherwise set by cyclic GC runs that json.loads' many dicts trigger",
    )
    args = parser.parse_args()
    if args.gc_tuned:
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
    settings = RoutingSettings()
    stats = _trained_stats(settings)
    rng = random.Random(1)
    cands = _candidates()
    cases: list[tuple[str, Api, bytes, float]] = [
        (
            "agent 100k tokens (messages, 400 KB)",
            "messages",
            json.dumps(agent_request()).encode(),
            2000.0,
        ),
        (
            "agent 100k tokens (chat, 1.4k small turns)",
            "chat",
            json.dumps(chat_agent_request()).encode(),
            2000.0,
        ),
        ("short chat (chat)", "chat", json.dumps(short_chat()).encode(), 100.0),
    ]
    loaders: list[tuple[str, Callable[[bytes], Any]]] = [("json", json.loads)]
    if args.orjson:
        try:
            orjson = importlib.import_module("orjson")
            loaders.append(("orjson", orjson.loads))
        except ImportError:
            print("orjson not installed: skipped")
    for label, api, raw, target in cases:
        print(f"{label}: body {len(raw) / 1024:.0f} KB")
        for name, loads in loaders:

            def full(
                loads: Callable[[bytes], Any] = loads, api: Api = api, raw: bytes = raw
            ) -> None:
                body = loads(raw)
                feats = extract_features(
                    api,
                    body,
                    chars_per_token=stats.calibrator.chars_per_token("mtp-demo"),
                    session_header=None,
                    pin_header=None,
                )
                decide(feats, cands, stats, settings, rng)

            _report(f"  {name}.loads only", _time(lambda: loads(raw), args.rounds), target)  # noqa: B023
            _report(f"  {name} parse+features+classify+decide", _time(full, args.rounds), target)
        body = json.loads(raw)
        feats = extract_features(
            api, body, chars_per_token=3.5, session_header=None, pin_header=None
        )

        def features_only(api: Api = api, body: Any = body) -> None:
            extract_features(api, body, chars_per_token=3.5, session_header=None, pin_header=None)

        _report("  extract_features only", _time(features_only, args.rounds), target)
        _report(
            "  classify+decide only",
            _time(lambda: decide(feats, cands, stats, settings, rng), args.rounds),  # noqa: B023
            target,
        )
        print(
            f"  -> {feats.kind}, ~{feats.est_prompt_tokens} tokens, agentic={feats.agentic}, "
            f"decision {decide(feats, cands, stats, settings, rng)}"
        )


if __name__ == "__main__":
    main()
