"""The real agent CLIs and SDKs, run non-interactively against `mtp-proxy serve`, once on
simulated backends and once on a real llama-server serving the real Qwen3.5 chat template (the
README's target family: Qwen3.5 and Qwen3.6 GGUFs carry it) from the pinned llama.cpp sdist, on a
tiny random model (the answers are gibberish, which is fine). Each client must exit 0, and every
line the proxy logged for its session must say 200.

The Qwen3.5 template opens a thinking block that the tiny model would never close; the server
runs with `--reasoning-budget`, which closes it after a few tokens, so every answer carries
reasoning and then text, as a real Qwen3.6 answer does.

The clients are pinned in scripts/clients.lock and installed into .clients/ by
scripts/install-clients.sh (which scripts/test.sh runs); a missing one fails, never skips. No
client flag names a model: the proxy's `[model_names] default` takes Claude Code's `claude-*`
names and Codex's `gpt-*` ones, as the embedded default does. Each client runs in a fresh HOME
with its telemetry and update checks off, and with every proxy variable pointing at a closed
loopback port, so that nothing but the proxy on loopback is reachable.

Environment (optional): MTP_CLIENT_TEMPLATES, comma-separated sdist template names to run the
real server with (default Qwen3.5-4B; e.g. "Qwen3.5-4B,google-gemma-4-31B-it"); MTP_CLIENT_RUNS,
a file that gets one JSON line per client run (test, exit code, the proxy's statuses), which
`python -m bench.client_table FILE` turns into the per-client, per-template table.

Deselect them offline with `-m "not clients"`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.support.chat_templates import QWEN35, template_args
from tests.support.harness import ProxyProcess, proxy_config, running_proxy, simulator_model
from tests.support.llama_pool import llama_model
from tests.support.tinygguf import LlamaConfig, write_llama
from tests.support.tinygguf.tokenizer import EOS_TOKEN, build_vocab

pytestmark = pytest.mark.clients

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / ".clients"
INSTALL_HINT = "run `bash scripts/install-clients.sh` (scripts/test.sh does)"
KEY = "sk-local-test"
RUN_TIMEOUT_S = 240.0
LONG_CONTEXT = 131072  # two slots of 64k tokens
DEAD_PROXY = "http://127.0.0.1:9"  # nothing listens: any non-loopback request fails at once
TEMPLATES = [t for t in os.environ.get("MTP_CLIENT_TEMPLATES", QWEN35).split(",") if t]
# Thinking tokens before llama-server closes the block (a real Qwen3.6 thinks, then answers).
REASONING_BUDGET = 8


def pins() -> dict[str, str]:
    found = {}
    for line in (ROOT / "scripts" / "clients.lock").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            found[key.strip()] = value.strip()
    return found


PINS = pins()


def client(*parts: str) -> str:
    path = CLIENTS.joinpath(*parts)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing; {INSTALL_HINT}", pytrace=False)
    return str(path)


# --- the two proxies --------------------------------------------------------------------------


@dataclass
class Target:
    """A proxy and the one model behind it."""

    name: str
    proxy: ProxyProcess
    model: str


def _simulated(workdir: Path) -> dict[str, Any]:
    demo = simulator_model(time_scale=50.0)
    config = proxy_config([demo])
    config["model_names"] = {"default": "mtp-demo"}  # as the embedded default
    return config


def _real(workdir: Path, template: str) -> dict[str, Any]:
    # The tiny llama model, trained (so to speak) for a context long enough for agent prompts:
    # llama-server caps -c at the model's context length.
    config = LlamaConfig(n_ctx=LONG_CONTEXT, name="tiny-llama-long")
    model_path = write_llama(workdir / "tiny-llama-long.gguf", config)
    # Room for Claude Code's system prompt and tools (~60k tokens of this byte-level vocabulary).
    # The tiny model never picks its end token (its LM-head row is zero), and Claude Code takes
    # an answer cut at max_tokens for an error: a bias on the end token (Qwen3.5's <|im_end|>)
    # ends answers after tens of tokens, with stop_reason end_turn.
    eos = build_vocab(LlamaConfig().n_merges).special_ids[EOS_TOKEN]
    args = ["-c", str(LONG_CONTEXT), "-np", "2", "-t", "1", "--logit-bias", f"{eos}+7"]
    args += [*template_args(template), "--reasoning-budget", str(REASONING_BUDGET)]
    model = llama_model(model_path, name="tiny", profiles=[{"name": "off"}], args=args)
    config = proxy_config([model])
    config["model_names"] = {"default": "tiny"}
    return config


@pytest.fixture(scope="module", params=["simulator", *(f"llama-server-{t}" for t in TEMPLATES)])
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    name: str = request.param
    workdir = tmp_path_factory.mktemp(f"clients-{name}")
    template = name.removeprefix("llama-server-")
    config = _simulated(workdir) if name == "simulator" else _real(workdir, template)
    with running_proxy(config, workdir) as proxy:
        yield Target(name, proxy, config["models"][0]["name"])


# --- running a client and reading what the proxy logged --------------------------------------


@dataclass
class Run:
    result: subprocess.CompletedProcess[str]
    lines: list[dict[str, Any]]  # the proxy's request lines written during the run

    def describe(self) -> str:
        rows = [(x["method"], x["path"], x["status"], x.get("error")) for x in self.lines]
        return (
            f"exit {self.result.returncode}\nstdout: {self.result.stdout[-1500:]}\n"
            f"stderr: {self.result.stderr[-2500:]}\nproxy: {rows}"
        )


def client_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "SYSTEMROOT")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        HTTP_PROXY=DEAD_PROXY,
        HTTPS_PROXY=DEAD_PROXY,
        ALL_PROXY=DEAD_PROXY,
        http_proxy=DEAD_PROXY,
        https_proxy=DEAD_PROXY,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        CI="true",
    )
    env.update(extra or {})
    return env


def run_client(
    target: Target, argv: list[str], home: Path, env: dict[str, str] | None = None
) -> Run:
    home.mkdir(parents=True, exist_ok=True)
    work = home / "work"
    work.mkdir(exist_ok=True)
    before = len(target.proxy.log_lines())
    result = subprocess.run(
        argv,
        cwd=work,
        env=client_env(home, env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    flush(target.proxy)
    lines = [x for x in target.proxy.log_lines()[before:] if x.get("event") == "request"]
    run = Run(result, [x for x in lines if x["path"] != "/metrics"])
    record(target, run)
    return run


def record(target: Target, run: Run) -> None:
    """One JSON line per client run into $MTP_CLIENT_RUNS, if set (bench/client_table.py)."""
    path = os.environ.get("MTP_CLIENT_RUNS")
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
    row = {
        "test": test,
        "target": target.name,
        "exit": run.result.returncode,
        "requests": [[x["method"], x["path"], x["status"]] for x in run.lines],
    }
    with open(path, "a") as out:
        out.write(json.dumps(row) + "\n")


def flush(proxy: ProxyProcess) -> None:
    """Scraping /metrics runs the deferred bookkeeping: every answered request is logged."""
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        response.read()  # answered after the lines were written (they are printed, unbuffered)


def assert_served(run: Run, *, background_abandoned: bool = False) -> list[dict[str, Any]]:
    """The client exited 0 and every generation request it made was answered 200.

    `background_abandoned`: the client may hang up on a background request when it exits
    (opencode drops its session-title request once the answer is done): such a request is
    logged 499, as it should be, and is not counted; the others must still be 200s.
    """
    assert run.result.returncode == 0, run.describe()
    lines = run.lines
    if background_abandoned:
        lines = [x for x in lines if not (x["status"] == 499 and x["api"] is not None)]
    generation = [x for x in lines if x["api"] is not None]
    assert generation, run.describe()
    assert all(x["status"] == 200 for x in lines), run.describe()
    return generation


# --- Claude Code ------------------------------------------------------------------------------


def claude_env(target: Target) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": target.proxy.url,
        "ANTHROPIC_API_KEY": KEY,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def test_claude_code_version_is_the_pinned_one() -> None:
    claude = client("node", "node_modules", ".bin", "claude")
    version = subprocess.run([claude, "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.split()[0] == PINS["CLAUDE_CODE"]


NPM_PINS = {
    "@anthropic-ai/claude-code": "CLAUDE_CODE",
    "@openai/codex": "CODEX",
    "opencode-ai": "OPENCODE",
    "@qwen-code/qwen-code": "QWEN_CODE",
    "ai": "AI_SDK",
    "@ai-sdk/openai": "AI_SDK_OPENAI",
    "zod": "ZOD",
}


def test_npm_clients_are_the_pinned_versions() -> None:
    for package, pin in NPM_PINS.items():
        manifest = CLIENTS / "node" / "node_modules" / package / "package.json"
        if not manifest.is_file():
            pytest.fail(f"{package} is missing; {INSTALL_HINT}", pytrace=False)
        assert json.loads(manifest.read_text())["version"] == PINS[pin], package


def test_claude_code_print_mode(target: Target, tmp_path: Path) -> None:
    claude = client("node", "node_modules", ".bin", "claude")
    run = run_client(target, [claude, "-p", "say hi"], tmp_path, claude_env(target))
    generation = assert_served(run)
    assert all(x["path"].startswith("/v1/messages") for x in generation)
    assert all(x["model"] == target.model for x in generation)  # claude-* names, by default
    assert run.result.stdout.strip()


def test_claude_code_stream_json(target: Target, tmp_path: Path) -> None:
    claude = client("node", "node_modules", ".bin", "claude")
    argv = [claude, "-p", "say hi", "--output-format", "stream-json", "--verbose"]
    run = run_client(target, argv, tmp_path, claude_env(target))
    assert_served(run)
    events = [json.loads(x) for x in run.result.stdout.splitlines() if x.strip()]
    assert events[-1]["type"] == "result" and events[-1]["subtype"] == "success", run.describe()


# --- Codex CLI --------------------------------------------------------------------------------


def run_codex(target: Target, tmp_path: Path, model: str | None) -> Run:
    """`codex exec "say hi"` with the README's config (no model line: Codex's own default)."""
    codex = client("node", "node_modules", ".bin", "codex")
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        (f'model = "{model}"\n' if model else "") + 'model_provider = "mtp"\n'
        "[model_providers.mtp]\n"
        'name = "mtp-proxy"\n'
        f'base_url = "{target.proxy.url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "MTP_PROXY_KEY"\n'
    )
    env = {"CODEX_HOME": str(codex_home), "MTP_PROXY_KEY": KEY}
    argv = [codex, "exec", "--skip-git-repo-check", "say hi"]
    return run_client(target, argv, tmp_path, env)


def test_codex_exec_over_responses(target: Target, tmp_path: Path) -> None:
    # The model named as the user names it: a name Codex does not know gets its classic request
    # shape. Its own current models' shape puts the tools in an `additional_tools` input item,
    # which llama-server refuses ("Cannot determine type of 'item'").
    run = run_codex(target, tmp_path, target.model)
    generation = assert_served(run)
    assert all(x["path"] == "/v1/responses" for x in generation), run.describe()
    assert all(x["output_tokens"] for x in generation), run.describe()  # complete, not 499


def test_codex_exec_with_its_default_model(target: Target, tmp_path: Path) -> None:
    """No model in the config: Codex picks its own current model and its request shape (four
    leading developer items, the tools in an `additional_tools` input item)."""
    run = run_codex(target, tmp_path, model=None)
    generation = assert_served(run)
    assert all(x["path"] == "/v1/responses" for x in generation), run.describe()
    assert all(x["output_tokens"] for x in generation), run.describe()


# --- opencode ---------------------------------------------------------------------------------

OPENCODE_PROVIDERS = {
    "openai-compatible": ("@ai-sdk/openai-compatible", "/v1", "/v1/chat/completions"),
    "openai-responses": ("@ai-sdk/openai", "/v1", "/v1/responses"),
    "anthropic": ("@ai-sdk/anthropic", "/v1", "/v1/messages"),
}


@pytest.mark.parametrize("provider", sorted(OPENCODE_PROVIDERS))
def test_opencode_run(target: Target, tmp_path: Path, provider: str) -> None:
    opencode = client("node", "node_modules", ".bin", "opencode")
    package, prefix, path = OPENCODE_PROVIDERS[provider]
    config = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "provider": {
            "local": {
                "npm": package,
                "name": "mtp-proxy",
                "options": {"baseURL": target.proxy.url + prefix, "apiKey": KEY},
                "models": {"agent-model": {"name": "agent-model"}},
            }
        },
        "model": "local/agent-model",
    }
    config_path = tmp_path / "opencode.json"
    tmp_path.mkdir(parents=True, exist_ok=True)
    config_path.write_text(json.dumps(config))
    env = {
        "OPENCODE_CONFIG": str(config_path),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    }
    run = run_client(target, [opencode, "run", "say hi"], tmp_path, env)
    generation = assert_served(run, background_abandoned=True)
    assert {x["path"] for x in generation} == {path}, run.describe()
    assert "Error" not in run.result.stderr, run.describe()


# --- Qwen Code -----------------------------------------------------------------------------------


def test_qwen_code_prompt(target: Target, tmp_path: Path) -> None:
    qwen = client("node", "node_modules", ".bin", "qwen")
    settings = tmp_path / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(
        json.dumps(
            {
                "general": {"enableAutoUpdate": False},
                "privacy": {"usageStatisticsEnabled": False},
                "telemetry": {"enabled": False},
            }
        )
    )
    env = {
        "OPENAI_API_KEY": KEY,
        "OPENAI_BASE_URL": target.proxy.url + "/v1",
        "OPENAI_MODEL": "agent-model",
        "QWEN_USAGE_STATISTICS_ENABLED": "0",
        "QWEN_TELEMETRY_ENABLED": "0",
    }
    run = run_client(target, [qwen, "-p", "say hi"], tmp_path, env)
    generation = assert_served(run)
    assert {x["path"] for x in generation} == {"/v1/chat/completions"}, run.describe()


# --- the Vercel AI SDK (Responses provider) ------------------------------------------------------

AISDK_SCRIPT = Path(__file__).with_name("aisdk_tool_turns.mjs")


def test_vercel_ai_sdk_responses_tool_conversation(target: Target, tmp_path: Path) -> None:
    node_modules = CLIENTS / "node" / "node_modules"
    if not (node_modules / "ai" / "package.json").is_file():
        pytest.fail(f"the Vercel AI SDK is missing; {INSTALL_HINT}", pytrace=False)
    node = shutil.which("node")
    assert node, INSTALL_HINT
    # ESM imports resolve next to the script: run a copy beside a link to the pinned packages.
    workdir = tmp_path / "aisdk"
    workdir.mkdir(parents=True)
    (workdir / "node_modules").symlink_to(node_modules)
    script = workdir / AISDK_SCRIPT.name
    shutil.copyfile(AISDK_SCRIPT, script)
    run = run_client(target, [node, str(script), target.proxy.url + "/v1", KEY], tmp_path)
    generation = assert_served(run)
    assert [x["path"] for x in generation] == ["/v1/responses"] * 2, run.describe()
    steps = json.loads(run.result.stdout.splitlines()[-1])
    assert steps["first"]["finish"] in {"stop", "length"}, run.describe()
    assert steps["second"]["finish"] in {"stop", "length"}, run.describe()


# --- aider and llm (PyPI, each in its own venv) ------------------------------------------------


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_aider_message(target: Target, tmp_path: Path, stream: str) -> None:
    aider = client("aider", "bin", "aider")
    argv = [
        aider, "--model", "openai/agent-model", "--openai-api-base", target.proxy.url + "/v1",
        "--openai-api-key", KEY, "--message", "say hi", stream, "--yes-always", "--no-git",
        "--no-auto-commits", "--no-check-update", "--no-show-model-warnings",
        "--analytics-disable", "--no-pretty", "--no-fancy-input",
    ]  # fmt: skip
    run = run_client(target, argv, tmp_path, {"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    generation = assert_served(run)
    assert {x["stream"] for x in generation} == {stream == "--stream"}, run.describe()


@pytest.mark.parametrize("stream", [True, False])
def test_llm_prompt(target: Target, tmp_path: Path, stream: bool) -> None:
    llm = client("llm", "bin", "llm")
    user_dir = tmp_path / "llm"
    user_dir.mkdir(parents=True)
    (user_dir / "extra-openai-models.yaml").write_text(
        f'- model_id: local\n  model_name: agent-model\n  api_base: "{target.proxy.url}/v1"\n'
    )
    argv = [llm, "-m", "local", "--key", KEY, "say hi", *([] if stream else ["--no-stream"])]
    run = run_client(target, argv, tmp_path, {"LLM_USER_PATH": str(user_dir)})
    generation = assert_served(run)
    assert {x["stream"] for x in generation} == {stream}, run.describe()


def test_pypi_clients_are_the_pinned_versions() -> None:
    for tool, package, pin in (("aider", "aider-chat", "AIDER"), ("llm", "llm", "LLM")):
        python = client(tool, "bin", "python")
        code = f"import importlib.metadata as m; print(m.version({package!r}))"
        found = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        assert found.stdout.strip() == PINS[pin], found.stderr


# --- the official SDKs ------------------------------------------------------------------------


def test_openai_sdk_chat_and_responses_stream(target: Target) -> None:
    sdk = openai.OpenAI(base_url=target.proxy.url + "/v1", api_key=KEY, max_retries=0)
    chat = sdk.chat.completions.create(
        model="gpt-5", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.choices[0].finish_reason in {"stop", "length"}
    deltas: list[str] = []
    with sdk.responses.stream(model="gpt-5", input="hi", max_output_tokens=16) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(deltas)
    counted = sdk.responses.input_tokens.count(model="gpt-5", input="hello there")
    assert counted.input_tokens > 0


def test_anthropic_sdk_messages_stream_and_count_tokens(target: Target) -> None:
    sdk = anthropic.Anthropic(base_url=target.proxy.url, api_key=KEY, max_retries=0)
    messages: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]
    made = sdk.messages.create(model="claude-haiku-4-5", max_tokens=16, messages=messages)
    assert made.usage.output_tokens > 0
    with sdk.messages.stream(model="claude-haiku-4-5", max_tokens=32, messages=messages) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    # On the Qwen3.5 template a thinking block comes first, then the text.
    kinds = [block.type for block in final.content]
    assert kinds in (["text"], ["thinking", "text"], ["thinking"]), kinds
    assert "".join(b.text for b in final.content if b.type == "text") == text
    counted = sdk.messages.count_tokens(model="claude-haiku-4-5", messages=messages)
    assert counted.input_tokens > 0


# --- llama-server's other routes, through the proxy -------------------------------------------


def test_llama_server_routes_through_the_proxy(target: Target) -> None:
    chat = {"messages": [{"role": "user", "content": "hello there"}]}
    status, tokens = call(target, "POST", "/tokenize?with_pieces=false", {"content": "hello"})
    assert status == 200 and tokens["tokens"], tokens
    status, text = call(target, "POST", "/detokenize", {"tokens": tokens["tokens"]})
    assert (status, text["content"]) == (200, "hello")
    status, props = call(target, "GET", "/props")
    assert status == 200 and props["default_generation_settings"]["n_ctx"] > 0
    status, applied = call(target, "POST", "/apply-template", chat)
    assert status == 200 and "hello there" in applied["prompt"]
    for path, body in (
        ("/v1/messages/count_tokens", {"model": "claude-haiku-4-5", **chat}),
        ("/v1/chat/completions/input_tokens", chat),
        ("/v1/responses/input_tokens", {"input": "hello there"}),
    ):
        status, counted = call(target, "POST", path, body)
        assert status == 200 and counted["input_tokens"] > 0, (path, counted)
    status, refused = call(target, "POST", "/slots/0?action=erase", {})
    assert status == 403 and refused["error"]["type"] == "permission_error"
    if target.name == "llama-server":  # routes the simulator does not serve
        status, native = call(target, "POST", "/completion", {"prompt": "hi", "n_predict": 4})
        assert status == 200 and native["tokens_predicted"] > 0 and "timings" in native
        status, embeddings = call(target, "POST", "/v1/embeddings", {"input": "hi"})
        assert status == 501 and "embeddings" in embeddings["error"]["message"]  # no --embeddings


def call(target: Target, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        target.proxy.url + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# --- a context too small for the agent --------------------------------------------------------


@pytest.fixture(scope="module")
def small_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """A real llama-server whose context (4096 tokens) cannot hold an agent's first prompt."""
    workdir = tmp_path_factory.mktemp("clients-small-context")
    model_path = write_llama(workdir / "tiny-llama.gguf", LlamaConfig(n_ctx=8192))
    args = ["-c", "4096", "-np", "1", "-t", "1", *template_args(QWEN35)]
    model = llama_model(model_path, name="tiny", profiles=[{"name": "off"}], args=args)
    config = proxy_config([model])
    config["model_names"] = {"default": "tiny"}
    with running_proxy(config, workdir) as proxy:
        yield Target("llama-server-small-context", proxy, "tiny")


def test_claude_code_reports_a_context_overflow_instead_of_retrying(
    small_context: Target, tmp_path: Path
) -> None:
    """llama-server's overflow 400 becomes Anthropic's "prompt is too long: N tokens > M maximum",
    which Claude Code reads: it weighs compacting, says why it cannot, and stops after one
    request (on llama-server's own words it only quotes the provider)."""
    claude = client("node", "node_modules", ".bin", "claude")
    argv = [claude, "-p", "say hi", "--output-format", "stream-json", "--verbose"]
    run = run_client(small_context, argv, tmp_path, claude_env(small_context))
    assert run.result.returncode == 1, run.describe()
    assert [x["status"] for x in run.lines if x["api"]] == [400], run.describe()
    result = json.loads(run.result.stdout.splitlines()[-1])
    assert result["terminal_reason"] == "prompt_too_long", run.describe()
    assert result["api_error_type"] == "invalid_request_error", run.describe()
    assert "(limit 4096)" in result["result"], run.describe()


def test_codex_reports_a_context_overflow_instead_of_retrying(
    small_context: Target, tmp_path: Path
) -> None:
    """The overflow as OpenAI's `context_length_exceeded`: Codex says the context is full."""
    run = run_codex(small_context, tmp_path, small_context.model)
    assert run.result.returncode == 1, run.describe()
    assert [x["status"] for x in run.lines if x["api"]] == [400], run.describe()
    assert "ran out of room in the model's context window" in run.result.stderr, run.describe()
