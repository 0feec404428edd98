"""llama-server's flags read in one place (supervisor.flags), the way llama-server reads them.

The real binary's side of the contract (the last occurrence wins) is checked in
tests/llama/test_llama_flags.py.
"""

from __future__ import annotations

import pytest

from proxy.config.settings import ModelSettings
from supervisor.flags import (
    CTX_SIZE,
    PARALLEL,
    flag_value,
    positive_int,
    speculation_in,
    supervisor_flag_in,
)


@pytest.mark.parametrize(
    ("argv", "slots"),
    [
        (["-np", "3"], 3),
        (["--parallel", "3"], 3),
        (["--parallel=3"], 3),
        (["-np=3"], 3),
        (["-t", "1", "-np", "2", "--alias", "m"], 2),
    ],
)
def test_parallel_in_every_form(argv: list[str], slots: int) -> None:
    assert positive_int(argv, PARALLEL) == slots


@pytest.mark.parametrize(
    ("argv", "slots"),
    [
        (["-np", "2", "--parallel", "3"], 3),
        (["--parallel", "3", "-np", "2"], 2),
        (["-np", "2", "--parallel=5"], 5),
        (["--parallel=5", "-np", "2", "-np", "4"], 4),
    ],
)
def test_the_last_occurrence_wins_under_either_name(argv: list[str], slots: int) -> None:
    assert positive_int(argv, PARALLEL) == slots


@pytest.mark.parametrize(
    ("argv", "ctx"),
    [
        (["-c", "8192"], 8192),
        (["--ctx-size", "8192"], 8192),
        (["--ctx-size=8192"], 8192),
        (["-c", "4096", "--ctx-size", "8192"], 8192),
        (["--ctx-size=8192", "-c", "1024"], 1024),
    ],
)
def test_ctx_size_in_every_form(argv: list[str], ctx: int) -> None:
    assert positive_int(argv, CTX_SIZE) == ctx


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["-np"],  # no value
        ["-np", "-1"],  # llama-server's "auto"
        ["-np", "0"],
        ["-np", "four"],
        ["-np", "3", "--parallel", "auto"],  # the last one is what counts
        ["--no-parallel-thing", "3"],  # another flag that only starts alike
        ["-npx", "3"],
    ],
)
def test_no_count_when_the_last_value_is_not_a_whole_number_above_zero(argv: list[str]) -> None:
    assert positive_int(argv, PARALLEL) is None


def test_flag_value_is_the_raw_text_of_the_last_occurrence() -> None:
    assert flag_value(["-ctk", "q8_0", "--cache-type-k=q4_0"], ("-ctk", "--cache-type-k")) == "q4_0"
    assert flag_value(["-m", "x.gguf"], CTX_SIZE) is None
    assert flag_value(["-c", "512", "-c"], CTX_SIZE) is None  # given last without a value


def test_speculation_in_reads_the_last_spec_type() -> None:
    assert speculation_in(["llama-server", "--spec-type", "draft-mtp"])
    assert speculation_in(["llama-server", "--spec-type=ngram-mod"])
    assert not speculation_in(["llama-server", "--spec-type", "draft-mtp", "--spec-type=none"])
    assert speculation_in(["llama-server", "--spec-type", "none", "--spec-type", "draft-mtp"])
    assert not speculation_in(["llama-server", "-m", "x"])


def test_supervisor_flag_in_names_the_first_host_or_port_argument() -> None:
    assert supervisor_flag_in(["-m", "x", "--port=8080", "--host", "h"]) == "--port=8080"
    assert supervisor_flag_in(["-m", "x", "--hostname", "h"]) is None


def _model(
    args: list[str], profile_args: list[str] | None = None, **fields: object
) -> ModelSettings:
    profile = {"name": "p", "args": profile_args or []}
    return ModelSettings(
        **{"name": "m", "backend": "simulator", "args": args, "profiles": [profile], **fields}
    )


@pytest.mark.parametrize(
    ("args", "profile_args", "slots"),
    [
        (["--parallel=3"], [], 3),  # read since flags.py: slots_of used to see 4 here
        (["-np", "2", "--parallel", "6"], [], 6),  # and 2 here (the first -np)
        (["-np", "2"], ["-np", "5"], 5),  # a profile's own args come last: they win
        ([], [], 4),  # llama-server's default
    ],
)
def test_slots_of_reads_the_flags_like_llama_server(
    args: list[str], profile_args: list[str], slots: int
) -> None:
    model = _model(args, profile_args)
    assert model.slots_of(model.profiles[0]) == slots


def test_configured_slots_win_over_the_flags() -> None:
    model = _model(["-np", "2"], slots=7)
    assert model.slots_of(model.profiles[0]) == 7
