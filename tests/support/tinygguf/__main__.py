"""Command line: `python -m tests.support.tinygguf OUT.gguf [--arch llama|qwen35] [options]`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .llama import LlamaConfig, write_llama
from .qwen35 import Mtp, Qwen35Config, write_qwen35


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.support.tinygguf", description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--arch", choices=["llama", "qwen35"], default="llama")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ctx", type=int, default=2048, help="training context length")
    p.add_argument(
        "--bigram",
        action="store_true",
        help="zero residual branches: next token depends only on the current one",
    )
    p.add_argument(
        "--mtp",
        choices=[m.value for m in Mtp],
        default=Mtp.RANDOM.value,
        help="qwen35 only: MTP block (identity + --bigram gives ~100%% draft acceptance)",
    )
    p.add_argument("--noise-seed", type=int, default=None, help="llama only: see --noise")
    p.add_argument(
        "--noise",
        type=float,
        default=0.0,
        help="llama only: add noise (x each tensor's std) from --noise-seed; same --seed plus "
        "noise makes a draft model with partial acceptance",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    started = time.perf_counter()
    if a.arch == "llama":
        cfg_l = LlamaConfig(
            seed=a.seed, n_ctx=a.ctx, bigram=a.bigram, noise_seed=a.noise_seed, noise=a.noise
        )
        path = write_llama(a.out, cfg_l)
        name = cfg_l.model_name()
    else:
        cfg_q = Qwen35Config(seed=a.seed, n_ctx=a.ctx, bigram=a.bigram, mtp=Mtp(a.mtp))
        path = write_qwen35(a.out, cfg_q)
        name = cfg_q.model_name()
    elapsed_ms = (time.perf_counter() - started) * 1000
    size = path.stat().st_size
    print(f"wrote {path}: {name}, {size} bytes, {elapsed_ms:.0f} ms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
