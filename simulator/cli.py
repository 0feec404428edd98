"""Command line: llama-server's flags (unknown ones accepted and ignored) plus the twin's own."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import platform
import re
import sys
from collections.abc import Sequence

import structlog

from simulator.config import SimConfig, parse_acceptance_scale
from simulator.model import DraftSettings
from simulator.presets import bundled_presets, load_preset
from supervisor.spec_types import SPEC_TYPES, type_names

# option string -> takes a value
_KNOWN: dict[str, bool] = {
    "-h": False,
    "--help": False,
    "--version": False,
    "-m": True,
    "--model": True,
    "--host": True,
    "--port": True,
    "--metrics": False,
    "-np": True,
    "--parallel": True,
    "-c": True,
    "--ctx-size": True,
    "-t": True,
    "--threads": True,
    "--spec-type": True,
    "--spec-draft-n-max": True,
    "--spec-draft-n-min": True,
    "--spec-draft-p-min": True,
    "--alias": True,
    "-a": True,
    "--preset": True,
    "--time-scale": True,
    "--load-time": True,
    "--seed": True,
    "-s": True,
    "--latent-sigma": True,
    "--acceptance-scale": True,
    "--ignore-request-draft": False,
    "-cram": True,
    "--cache-ram": True,
    "--cache-idle-slots": False,
    "--no-cache-idle-slots": False,
    "--refuse-late-system": False,
    "--no-refuse-late-system": False,
}
_NUMBER = re.compile(r"-\d")


def known_args(argv: Sequence[str]) -> list[str]:
    """Drop llama-server flags the twin does not model (-ngl 99, -fa on, --jinja, -md X ...).

    Done before argparse because argparse would read e.g. `-md X` as `-m d` and `-ctk q8_0` as
    `-c tk`. An unknown flag's value is the next word unless that word is itself a flag.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        name = word.split("=", 1)[0]
        if name in _KNOWN:
            out.append(word)
            if _KNOWN[name] and "=" not in word and i + 1 < len(argv):
                out.append(argv[i + 1])
                i += 1
        elif word.startswith("-") and "=" not in word and i + 1 < len(argv):
            following = argv[i + 1]
            if not following.startswith("-") or _NUMBER.match(following):
                i += 1  # skip the unknown flag's value too
        i += 1
    return out


class _Version(argparse.Action):
    """``--version`` in llama-server's words (stderr, ``version:`` and ``built with`` lines)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        try:
            own = importlib.metadata.version("mtp-proxy")
        except importlib.metadata.PackageNotFoundError:
            own = "0"
        sys.stderr.write(
            f"version: simulator {own}\nbuilt with Python {platform.python_version()}\n"
        )
        parser.exit(0)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m simulator",
        description="A llama-server twin whose speed follows a calibrated model of MTP decoding.",
        allow_abbrev=False,
    )
    # As llama-server: its build on stderr, then exit (the proxy keys what it learned by it).
    p.add_argument("--version", action=_Version, nargs=0)
    p.add_argument("-m", "--model", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--metrics", action="store_true")
    p.add_argument("-np", "--parallel", type=int, default=1)
    p.add_argument("-c", "--ctx-size", type=int, default=0)
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("--spec-type", default="none")
    p.add_argument("--spec-draft-n-max", type=int, default=16)
    p.add_argument("--spec-draft-n-min", type=int, default=0)
    p.add_argument("--spec-draft-p-min", type=float, default=0.75)
    p.add_argument("-a", "--alias", default=None)
    p.add_argument(
        "--preset",
        default="setup-b",
        help=f"calibration preset: {', '.join(bundled_presets())} (simulator/presets/), or a "
        ".toml path (cpu-gemma3-270m: fitted to a measured CPU run; fast: for tests; the others: "
        "published GPU figures)",
    )
    p.add_argument("--time-scale", type=float, default=1.0, help="simulated s per wall s")
    p.add_argument("--load-time", type=float, default=0.0, help="seconds of 503 Loading model")
    p.add_argument("-s", "--seed", type=int, default=0)
    p.add_argument(
        "--latent-sigma",
        type=float,
        default=None,
        help="override the preset's per-session acceptance spread (0: every session alike)",
    )
    p.add_argument(
        "--acceptance-scale",
        default="",
        metavar="[KIND=]F,...",
        help="multiply the acceptance of code and/or prose requests by F (e.g. code=0.3; "
        "a bare F scales both)",
    )
    p.add_argument(
        "--ignore-request-draft",
        action="store_true",
        help='ignore a request\'s "speculative.n_max" like stock llama-server (default: honour '
        "it like the patched build)",
    )
    p.add_argument(
        "-cram",
        "--cache-ram",
        type=int,
        default=8192,
        help="host-memory prompt cache in MiB, as llama-server (default 8192; 0 disables; "
        "-1 no limit)",
    )
    p.add_argument(
        "--cache-idle-slots",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="save idle slots to the prompt cache at each new task, as llama-server (default on)",
    )
    p.add_argument(
        "--refuse-late-system",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="answer a system/developer message that is not first with 500, as llama-server "
        "with the Qwen3.5/3.6 chat template (default: as the preset's [chat_template] says; "
        "on in the Qwen presets, off in fast)",
    )
    return p


def parse_config(argv: Sequence[str]) -> SimConfig:
    parser = _parser()
    args = parser.parse_args(known_args(argv))
    if args.time_scale <= 0:
        parser.error("--time-scale must be > 0")
    if args.parallel < 1:
        parser.error("-np must be >= 1")
    if not 0.0 <= args.spec_draft_p_min <= 1.0:
        parser.error("--spec-draft-p-min must be within [0, 1]")
    _refuse_unknown_types(args.spec_type)
    n_max = max(0, args.spec_draft_n_max)
    try:
        scales = parse_acceptance_scale(args.acceptance_scale)
    except ValueError as exc:
        parser.error(f"--acceptance-scale: {exc}")
    return SimConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        alias=args.alias,
        n_parallel=args.parallel,
        n_ctx=max(0, args.ctx_size),
        threads=args.threads,
        metrics=args.metrics,
        draft=DraftSettings(
            spec_type=args.spec_type,
            n_max=n_max,
            n_min=max(0, min(args.spec_draft_n_min, n_max)),
            p_min=args.spec_draft_p_min,
        ),
        preset=args.preset,
        time_scale=args.time_scale,
        load_time=max(0.0, args.load_time),
        seed=args.seed,
        latent_sigma=args.latent_sigma,
        acceptance_scale=scales,
        request_draft=not args.ignore_request_draft,
        cache_ram_mib=args.cache_ram,
        cache_idle_slots=args.cache_idle_slots,
        refuse_late_system=args.refuse_late_system,
    )


def _refuse_unknown_types(spec_type: str) -> None:
    """Exit 1 on a speculative type the pinned llama-server does not know, as it does."""
    for name in type_names(spec_type):
        if name not in SPEC_TYPES:
            print(
                f'error while handling argument "--spec-type": unknown speculative type: {name}',
                file=sys.stderr,
            )
            raise SystemExit(1)


def main(argv: Sequence[str] | None = None) -> int:
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    config = parse_config(sys.argv[1:] if argv is None else argv)
    try:
        preset = load_preset(config.preset)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: preset {config.preset!r}: {exc}", file=sys.stderr)
        return 2
    from simulator.server import serve  # imported late: keeps --help and errors fast

    try:
        import uvloop
    except ImportError:  # pragma: no cover - win32
        factory = None
    else:
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(config, preset))
    return 0
