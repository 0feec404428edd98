"""Decode speed and acceptance by per-request depth, for speculative types on a real small model.

    python -m bench.spec_depths [--llama-server BIN] [--model GGUF]
        [--types ngram-simple,ngram-mod,draft-simple] [--depths 0,2,4,8,16] [--repeats 3]
        [--tokens 128] [--json FILE]

One patched llama-server per type (``-t 1``, one slot, started at the deepest depth, so every
depth is a per-request ``"speculative.n_max"``), on Gemma 3 270M Q4_K_M by default (the fetch
script's cached file, scripts/fetch-models.sh). Three prompt classes, greedy completions of
``tokens`` tokens: a short code edit, prose, and a copy of a 6 kB Python file given in the prompt
(the standard library's fnmatch.py). Each repeat asks every class at every depth in turn, so a
drift of the machine or of a type's n-gram state falls on all depths alike. It prints, per type
and class, the median decode speed of each depth over depth 0's (and the acceptance), measured
side by side in one run.

draft-simple uses the model as its own draft (``-md`` the same file): a control, every drafted
token costs a forward pass of the same size. About 10 minutes on two cores with the defaults.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.support.llama_fixtures import LlamaServer, running_llama_server
from tests.support.real_models import GEMMA3_270M, cache_dir, pinned_models

DEPTH_KEY = "speculative.n_max"
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
CLASSES = {"code-edit": CODE_EDIT, "prose": PROSE, "copy-6kB": COPY}


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


def complete(server: LlamaServer, prompt: str, depth: int, tokens: int) -> tuple[float, int, int]:
    """One greedy completion: its decode speed, drafted and accepted tokens."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, DEPTH_KEY: depth}
    status, answer = server.post_json("/v1/completions", body, timeout=600)
    if status != 200:
        raise RuntimeError(f"/v1/completions answered {status}: {answer}")
    t = answer["timings"]
    speed = 1e3 * float(t["predicted_n"]) / float(t["predicted_ms"])
    return speed, int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))


def measure(
    binary: str, model: Path, spec_type: str, depths: list[int], repeats: int, tokens: int
) -> list[Sample]:
    samples = []
    with (
        tempfile.TemporaryDirectory() as logs,
        running_llama_server(
            model,
            *type_args(spec_type, model, max(depths)),
            log_dir=Path(logs),
            binary=binary,
            parallel=1,
            ctx=8192,
            ready_timeout=120,
        ) as server,
    ):
        for _ in range(repeats):
            for kind, prompt in CLASSES.items():
                for depth in depths:
                    speed, drafted, accepted = complete(server, prompt, depth, tokens)
                    samples.append(Sample(spec_type, kind, depth, speed, drafted, accepted))
    return samples


def report(samples: list[Sample], depths: list[int]) -> None:
    """Per type and class: each depth's median speed over depth 0's, then its acceptance."""
    head = "".join(f"{'d' + str(d):>8}" for d in depths)
    for spec_type in dict.fromkeys(s.spec_type for s in samples):
        print(f"\n{spec_type}: median decode tok/s at depth 0, each depth / depth 0 (acceptance)")
        print(f"{'class':<10}{'tok/s':>7}{head}")
        for kind in CLASSES:
            mine = [s for s in samples if (s.spec_type, s.kind) == (spec_type, kind)]
            speed = {d: statistics.median(s.tok_s for s in mine if s.depth == d) for d in depths}
            base = speed[depths[0]]
            ratios = "".join(f"{speed[d] / base:>8.2f}" for d in depths)
            print(f"{kind:<10}{base:>7.1f}{ratios}")
            accept = "".join(f"{_acceptance(mine, d):>8}" for d in depths)
            print(f"{'':<17}{accept}")


def _acceptance(samples: list[Sample], depth: int) -> str:
    drafted = sum(s.drafted for s in samples if s.depth == depth)
    accepted = sum(s.accepted for s in samples if s.depth == depth)
    return f"{accepted / drafted:.2f}" if drafted else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", required=True, help="the patched build")
    parser.add_argument("--model", type=Path, default=None, help="default: Gemma 3 270M, cached")
    parser.add_argument("--types", default="ngram-simple,ngram-mod,draft-simple")
    parser.add_argument("--depths", default="0,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, default=None, help="write every sample here")
    args = parser.parse_args(argv)
    model = args.model or cache_dir() / pinned_models()[GEMMA3_270M].file
    depths = sorted({int(d) for d in args.depths.split(",")})
    if depths[0] != 0:
        parser.error("--depths must include 0 (the ratios are to it)")
    samples: list[Sample] = []
    for spec_type in args.types.split(","):
        samples += measure(args.llama_server, model, spec_type, depths, args.repeats, args.tokens)
    report(samples, depths)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(s) for s in samples], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
