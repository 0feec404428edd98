"""A LiteLLM proxy on loopback in front of simulator backends, as the comparison in bench.overhead.

Each model is an OpenAI-compatible backend (`openai/<name>` at `<url>/v1`), which is how LiteLLM
is pointed at a llama-server. Nothing leaves the machine: the model cost map is the bundled one,
telemetry is off, no database, one worker. Needs the `litellm[proxy]` package.

    python -m bench.litellm_proxy NAME=URL [NAME=URL ...]   # runs until Ctrl-C

Requirement (for the `bench` extra): litellm[proxy]>=1.80
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.processes import free_port, spawn, stop_child, wait_ok


@dataclass
class LiteLLMProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        stop_child(self.process, 15, group=True)  # its workers too


def litellm_config(backends: dict[str, str], master_key: str) -> str:
    """LiteLLM's YAML config (JSON is valid YAML): each model an OpenAI-compatible backend;
    clients authenticate with `master_key` (checked in memory: there is no database)."""
    config = {
        "model_list": [
            {
                "model_name": name,
                "litellm_params": {
                    "model": f"openai/{name}",
                    "api_base": f"{url.rstrip('/')}/v1",
                    "api_key": "none",
                    "timeout": 600,
                },
            }
            for name, url in backends.items()
        ],
        "litellm_settings": {"telemetry": False, "drop_params": True, "set_verbose": False},
        "general_settings": {"master_key": master_key},
    }
    return json.dumps(config, indent=2)


def start_litellm(
    backends: dict[str, str], workdir: Path, *, master_key: str, timeout: float = 120.0
) -> LiteLLMProcess:
    """Start `litellm --config` on a free loopback port; return once its liveness probe answers."""
    binary = shutil.which("litellm", path=str(Path(sys.executable).parent)) or shutil.which(
        "litellm"
    )
    if binary is None:
        raise RuntimeError("litellm is not installed: pip install 'litellm[proxy]'")
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "litellm.yaml"
    config_path.write_text(litellm_config(backends, master_key))
    port = free_port()
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download of the cost map
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "NO_DOCS": "True",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DATABASE_URL", None)
    log_path = workdir / "litellm.log"
    argv = [binary, "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--num_workers", "1", "--telemetry", "False"]
    proxy = LiteLLMProcess(spawn(argv, log_path, env=env), port, log_path)
    try:
        live = wait_ok(proxy.url + "/health/liveliness", proxy.process, "litellm", timeout=timeout)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}:\n{proxy.tail()}") from None
    if not live:
        proxy.stop()
        raise TimeoutError(f"litellm not live within {timeout}s:\n{proxy.tail()}")
    return proxy


def main(argv: list[str] | None = None) -> int:
    pairs = argv if argv is not None else sys.argv[1:]
    if not pairs:
        print(__doc__)
        return 2
    backends = dict(pair.split("=", 1) for pair in pairs)
    key = "sk-bench-" + secrets.token_hex(16)
    proxy = start_litellm(backends, Path(".litellm-bench"), master_key=key)
    print(f"master key: {key}")
    print(f"LiteLLM proxy at {proxy.url} (pid {proxy.pid}); Ctrl-C stops it", flush=True)
    try:
        proxy.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
