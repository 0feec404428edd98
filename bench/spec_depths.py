"""Decode speed and acceptance by per-request depth, for speculative types on a real small model.

    python -m bench.spec_depths [--llama-server BIN] [--model GGUF]
        [--types ngram-simple,ngram-mod,draft-simple] [--depths 0,2,4,8,16] [--repeats 3]
        [--tokens 128] [--classes code-edit,prose,copy-6kB] [--parallel 1] [--json FILE]

The binary: --llama-server, else $MTP_PATCHED_LLAMA_SERVER; the model: --model, else
$MTP_MODEL_GEMMA3_270M, else Gemma 3 270M Q4_K_M from the fetch script's cache
(scripts/fetch-models.sh). One patched llama-server per type (``-t 1``, one slot, started at the
deepest depth, so every depth is a per-request ``"speculative.n_max"``). Three prompt classes,
greedy completions of ``tokens`` tokens: a short code edit, prose, and a copy of a 6 kB Python file
given in the prompt (the standard library's fnmatch.py); ``--classes`` may add ``long-context``, a
13 kB Python file (shlex.py) to explain in plain words. Each repeat asks every class at every depth
in turn, so a drift of the machine or of a type's n-gram state falls on all depths alike. It
prints, per type and class, the median decode speed of each depth over depth 0's (and the
acceptance), measured side by side in one run.

``--parallel 1,4`` measures again on a server with ``-np 4`` (the context grows with it, so
each slot keeps 8,192 tokens), each class and depth as a burst of 4 identical requests sent at
once: every slot decodes beside three others. ``--json`` writes the command, every sample (with
the server's ``predicted_n``, ``predicted_ms`` and prompt tokens) and the summary per server,
class and depth: median tok/s, acceptance, tokens and drafts per verification step and a step's
time (tests/fixtures/real_engine/ holds such a file, the simulator's fitted preset's truth).

draft-simple uses the model as its own draft (``-md`` the same file): a control, every drafted
token costs a forward pass of the same size. About 10 minutes on two cores with the defaults.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.support.llama_fixtures import LlamaServer, running_llama_server
from tests.support.real_models import GEMMA3_270M, cache_dir, pinned_models

DEPTH_KEY = "speculative.n_max"
BINARY_ENV = "MTP_PATCHED_LLAMA_SERVER"
MODEL_ENV = "MTP_MODEL_GEMMA3_270M"
CODE_EDIT = """def total(items):
    result = 0
    for item in items:
        result += item.price * item.count
    return result


# The same function with the loop variable renamed from item to entry:
def total(items):
"""
PROSE = "The old lighthouse keeper climbed the stairs every evening. "
COPY = (
    "Here is fnmatch.py:\n```python\n"
    + Path(fnmatch.__file__).read_text()
    + "```\n\nThe same file, copied exactly:\n```python\n"
)
LONG = (
    "Here is shlex.py:\n```python\n"
    + Path(shlex.__file__).read_text()
    + "```\n\nExplain in plain English what this module does and how to use it.\n"
)
CLASSES = {"code-edit": CODE_EDIT, "prose": PROSE, "copy-6kB": COPY}
MORE_CLASSES = {**CLASSES, "long-context": LONG}
SLOT_CTX = 8192


def type_args(spec_type: str, model: Path, deepest: int) -> list[str]:
    """The server's speculative flags: started at ``deepest`` (the patch caps every drafter,
    n-gram ones included, at --spec-draft-n-max)."""
    args = ["--spec-type", spec_type, "--spec-draft-n-max", str(deepest)]
    if spec_type == "ngram-mod":  # its default n_min (48) drafts only 48-token runs
        args += ["--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", str(deepest)]
    if spec_type.startswith("draft-"):
        args += ["-md", str(model)]
    return args


@dataclass(frozen=True)
class Sample:
    spec_type: str
    kind: str
    depth: int
    tok_s: float
    drafted: int
    accepted: int
    parallel: int = 1  # the server's -np: requests decoding side by side
    predicted_n: int = 0
    predicted_ms: float = 0.0
    prompt_tokens: int = 0  # the whole prompt: processed (prompt_n) and from the cache (cache_n)
    prompt_n: int = 0  # of which processed by this request
    prompt_ms: float = 0.0


def complete(
    server: LlamaServer, prompt: str, depth: int, tokens: int
) -> tuple[float, int, int, dict[str, Any]]:
    """One greedy completion: its decode speed, drafted and accepted tokens, its timings."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, DEPTH_KEY: depth}
    status, answer = server.post_json("/v1/completions", body, timeout=900)
    if status != 200:
        raise RuntimeError(f"/v1/completions answered {status}: {answer}")
    t = answer["timings"]
    n, ms = int(t["predicted_n"]), float(t["predicted_ms"])
    if n <= 0 or ms <= 0:  # checked before trusted: a ratio of them is every figure here
        raise RuntimeError(f"/v1/completions timings out of range: {t}")
    return 1e3 * n / ms, int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0)), t


def burst(
    server: LlamaServer, spec_type: str, kind: str, depth: int, tokens: int, parallel: int
) -> list[Sample]:
    """``parallel`` identical requests sent at once (one alone when 1)."""
    prompt = MORE_CLASSES[kind]
    with ThreadPoolExecutor(parallel) as pool:
        answers = list(pool.map(lambda _: complete(server, prompt, depth, tokens), range(parallel)))
    return [
        Sample(
            spec_type,
            kind,
            depth,
            speed,
            drafted,
            accepted,
            parallel,
            int(t["predicted_n"]),
            float(t["predicted_ms"]),
            int(t.get("prompt_n", 0)) + int(t.get("cache_n", 0)),
            int(t.get("prompt_n", 0)),
            float(t.get("prompt_ms", 0.0)),
        )
        for speed, drafted, accepted, t in answers
    ]


def measure(
    binary: str,
    model: Path,
    spec_type: str,
    depths: list[int],
    repeats: int,
    tokens: int,
    classes: list[str] | None = None,
    parallel: int = 1,
) -> list[Sample]:
    samples = []
    with (
        tempfile.TemporaryDirectory() as logs,
        running_llama_server(
            model,
            *type_args(spec_type, model, max(depths)),
            log_dir=Path(logs),
            binary=binary,
            parallel=parallel,
            ctx=SLOT_CTX * parallel,
            ready_timeout=120,
        ) as server,
    ):
        for _ in range(repeats):
            for kind in classes or list(CLASSES):
                for depth in depths:
                    samples += burst(server, spec_type, kind, depth, tokens, parallel)
    return samples


def summary(samples: list[Sample]) -> list[dict[str, Any]]:
    """Per type, server (-np), class and depth: the medians and totals a preset is fitted to.

    A verification step yields 1 + accepted tokens, so a request took ``predicted_n -
    accepted`` steps; a step's time is its decode time over them.
    """
    rows = []
    keys = dict.fromkeys((s.spec_type, s.parallel, s.kind, s.depth) for s in samples)
    for spec_type, parallel, kind, depth in keys:
        mine = [s for s in samples if (s.spec_type, s.parallel, s.kind, s.depth) == (
            spec_type, parallel, kind, depth)]  # fmt: skip
        n = sum(s.predicted_n for s in mine)
        drafted, accepted = sum(s.drafted for s in mine), sum(s.accepted for s in mine)
        steps = max(1, n - accepted)
        rows.append({
            "spec_type": spec_type, "parallel": parallel, "class": kind, "depth": depth,
            "requests": len(mine),
            "tok_s": round(statistics.median(s.tok_s for s in mine), 2),
            "acceptance": round(accepted / drafted, 3) if drafted else None,
            "tokens_per_step": round(n / steps, 3),
            "drafted_per_step": round(drafted / steps, 3),
            "step_ms": round(sum(s.predicted_ms for s in mine) / steps, 3),
            "prompt_tokens": max(s.prompt_tokens for s in mine),
            "predicted_n": round(n / len(mine), 1),
        })  # fmt: skip
    return rows


def report(samples: list[Sample], depths: list[int]) -> None:
    """Per type and class: each depth's median speed over depth 0's, then its acceptance."""
    head = "".join(f"{'d' + str(d):>8}" for d in depths)
    for spec_type in dict.fromkeys(s.spec_type for s in samples):
        print(f"\n{spec_type}: median decode tok/s at depth 0, each depth / depth 0 (acceptance)")
        print(f"{'class':<10}{'tok/s':>7}{head}")
        for parallel, kind in dict.fromkeys(
            (s.parallel, s.kind) for s in samples if s.spec_type == spec_type
        ):
            mine = [s for s in samples if (s.spec_type, s.kind, s.parallel) == (
                spec_type, kind, parallel)]  # fmt: skip
            label = kind if parallel == 1 else f"{kind} x{parallel}"
            speed = {d: statistics.median(s.tok_s for s in mine if s.depth == d) for d in depths}
            base = speed[depths[0]]
            ratios = "".join(f"{speed[d] / base:>8.2f}" for d in depths)
            print(f"{label:<10}{base:>7.1f}{ratios}")
            accept = "".join(f"{_acceptance(mine, d):>8}" for d in depths)
            print(f"{'':<17}{accept}")


def _acceptance(samples: list[Sample], depth: int) -> str:
    drafted = sum(s.drafted for s in samples if s.depth == depth)
    accepted = sum(s.accepted for s in samples if s.depth == depth)
    return f"{accepted / drafted:.2f}" if drafted else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--llama-server",
        default=os.environ.get(BINARY_ENV),
        help=f"the patched build (default: ${BINARY_ENV})",
    )
    parser.add_argument(
        "--model",
        default=os.environ.get(MODEL_ENV),
        help=f"default: ${MODEL_ENV}, else Gemma 3 270M from the fetch script's cache",
    )
    parser.add_argument("--types", default="ngram-simple,ngram-mod,draft-simple")
    parser.add_argument("--depths", default="0,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--classes", default=",".join(CLASSES), help=", ".join(MORE_CLASSES))
    parser.add_argument("--parallel", default="1", help="-np of each server, e.g. 1,4")
    parser.add_argument("--json", type=Path, default=None, help="write every sample here")
    args = parser.parse_args(argv)
    if not args.llama_server:
        parser.error(f"no llama-server: --llama-server or ${BINARY_ENV} (the patched build)")
    model = Path(args.model) if args.model else cache_dir() / pinned_models()[GEMMA3_270M].file
    depths = sorted({int(d) for d in args.depths.split(",")})
    if depths[0] != 0:
        parser.error("--depths must include 0 (the ratios are to it)")
    classes = args.classes.split(",")
    if unknown := set(classes) - set(MORE_CLASSES):
        parser.error(f"unknown classes {sorted(unknown)}; known: {', '.join(MORE_CLASSES)}")
    samples: list[Sample] = []
    for spec_type in args.types.split(","):
        for parallel in (int(p) for p in args.parallel.split(",")):
            samples += measure(
                args.llama_server, model, spec_type, depths, args.repeats, args.tokens,
                classes, parallel,
            )  # fmt: skip
    report(samples, depths)
    if args.json is not None:
        record = {
            "command": "python -m bench.spec_depths "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "model": model.name,
            "threads": 1,
            "spec_types": args.types.split(","),
            "summary": summary(samples),
            "samples": [asdict(s) for s in samples],
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
