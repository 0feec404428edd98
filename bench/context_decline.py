"""Depth 3 against depth 0, per request, as the context grows, on each preset's simulator.

    python -m bench.context_decline [--preset setup-a,...] [--contexts 0,8,16,32] [--loads 2,4]
                                    [--tokens 96] [--time-scale 20] [--seed 1]

The start-up calibration measures on short prompts, and the busy rule carries what it measured
to the context a process serves along one published single-stream decline
(``CONTEXT_DECLINE_PER_KTOK``). Measuring the decline on the box instead (a long-prompt burst in
the calibration) is the alternative for the presets where that carry puts a busy process at the
wrong depth. This measures what such a burst would find: for each preset, load and
context, ``load`` completions at once at depth 0 and then at depth 3, code and then prose, each
the calibration's own prompt after ``context`` thousand tokens of its kind, ``tokens`` long with
``ignore_eos``. It prints depth 3 / depth 0 of the mean per-request decode speed, and beside it
what the busy rule's carry predicts from the short prompts' ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from dataclasses import dataclass

import aiohttp

from bench.decide_micro import code_text, prose_text
from bench.processes import start_simulator
from proxy.routing.calibrate import PROMPTS
from proxy.routing.calibration import CONTEXT_DECLINE_PER_KTOK
from supervisor.completion import DEPTH_KEY

KINDS = (("code", PROMPTS[0], 3.3), ("prose", PROMPTS[1], 3.9))
"""Kind, the calibration's prompt of that kind, and the simulator's characters per token."""


@dataclass(frozen=True)
class Row:
    load: int
    context: int
    """Prompt tokens, as the simulator counted them."""
    ratios: dict[str, float]
    """Kind -> depth 3's mean per-request decode speed over depth 0's."""


def prompt(kind: int, ktok: int, index: int) -> str:
    """The calibration's prompt of that kind after ``ktok`` thousand tokens of its kind; the
    index keeps concurrent requests' prompts apart (no shared prefix cache)."""
    _, tail, chars_per_token = KINDS[kind]
    chars = int(ktok * 1000 * chars_per_token)
    filler = code_text(chars, seed=index) if kind == 0 else prose_text(chars)
    return f"#{index}\n{filler}{tail}"


async def decode_speed(
    session: aiohttp.ClientSession, url: str, text: str, depth: int, tokens: int
) -> tuple[float, int]:
    """One completion's decode speed (tok/s) and its prompt's tokens."""
    body = {
        DEPTH_KEY: depth,
        "model": "m",
        "prompt": text,
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    async with session.post(url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        timings = (await response.json())["timings"]
    speed = 1e3 * float(timings["predicted_n"]) / float(timings["predicted_ms"])
    return speed, int(timings["prompt_n"]) + int(timings.get("cache_n") or 0)


async def burst(
    session: aiohttp.ClientSession, url: str, texts: list[str], depth: int, tokens: int
) -> tuple[float, int]:
    """The prompts at once at ``depth``: their mean decode speed, and the first one's tokens."""
    answers = await asyncio.gather(*(decode_speed(session, url, t, depth, tokens) for t in texts))
    return sum(speed for speed, _ in answers) / len(answers), answers[0][1]


async def measure(url: str, loads: list[int], contexts: list[int], tokens: int) -> list[Row]:
    """One row per (load, context): each kind's burst at depth 0, then at depth 3."""
    rows: list[Row] = []
    async with aiohttp.ClientSession() as session:
        for load in loads:
            for ktok in contexts:
                ratios: dict[str, float] = {}
                longest = 0
                for kind, (name, _, _) in enumerate(KINDS):
                    texts = [prompt(kind, ktok, i) for i in range(load)]
                    plain, context = await burst(session, url, texts, 0, tokens)
                    deep, _ = await burst(session, url, texts, 3, tokens)
                    ratios[name], longest = deep / plain, max(longest, context)
                rows.append(Row(load, longest, ratios))
    return rows


def report(preset: str, rows: list[Row]) -> None:
    print(f"preset {preset}: depth 3 / depth 0, per-request decode speed (carried: the busy")
    print("rule's prediction from the first row of that load, CONTEXT_DECLINE_PER_KTOK)")
    print(f"{'load':>4} {'context':>8}  {'code':>6} {'carried':>7}  {'prose':>6} {'carried':>7}")
    first: dict[int, Row] = {}
    for row in rows:
        base = first.setdefault(row.load, row)
        cells = []
        for name in row.ratios:
            carry = CONTEXT_DECLINE_PER_KTOK * (row.context - base.context) / 1000.0
            predicted = base.ratios[name] * math.exp(carry)
            cells.append(f"{row.ratios[name]:6.3f} {predicted:7.3f}")
        print(f"{row.load:>4} {row.context:>8}  " + "  ".join(cells))


def simulator_args(preset: str, slots: int, *, time_scale: float, seed: int) -> list[str]:
    """The preset's simulator, one process at depth 3 with ``slots`` slots."""
    return [
        *("-m", "m", "--preset", preset, "-np", str(slots), "-c", "131072"),
        *("--spec-type", "draft-mtp", "--spec-draft-n-max", "3"),
        *("--time-scale", str(time_scale), "-s", str(seed)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="setup-a,setup-b,setup-b-batched,rtx3090-250w")
    parser.add_argument("--contexts", default="0,8,16,32", help="thousands of tokens")
    parser.add_argument("--loads", default="2,4")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    loads = [int(x) for x in args.loads.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    for preset in args.preset.split(","):
        server = start_simulator(
            simulator_args(preset, max(loads), time_scale=args.time_scale, seed=args.seed)
        )
        try:
            rows = asyncio.run(measure(server.url, loads, contexts, args.tokens))
        finally:
            server.stop()
        report(preset, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
