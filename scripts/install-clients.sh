#!/usr/bin/env bash
# The real agent CLIs and SDKs of the `clients` tests, pinned in scripts/clients.lock, into
# .clients/: Claude Code, Codex CLI, opencode, Qwen Code and the Vercel AI SDK (ai, @ai-sdk/openai,
# zod) from npm (node/), aider and llm from PyPI, each in its own venv so that their pins never
# fight the project's. Node and npm come from Debian's packages
# when missing (as root). A second run with the same pins does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=clients.lock
source scripts/clients.lock
dest=.clients
stamp="$dest/installed"
want="claude-code=$CLAUDE_CODE codex=$CODEX opencode=$OPENCODE qwen-code=$QWEN_CODE"
want="$want ai=$AI_SDK ai-sdk-openai=$AI_SDK_OPENAI zod=$ZOD aider=$AIDER llm=$LLM"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  else
    echo "install-clients: need node and npm (apt-get install nodejs npm as root)" >&2
    exit 1
  fi
fi
rm -rf "$dest"
mkdir -p "$dest"
# opencode's own postinstall picks a platform package and may pick a missing one: name the
# glibc x64 build explicitly where it applies (its optional dependency of the same version).
platform=()
if [ "$(uname -sm)" = "Linux x86_64" ]; then platform=("opencode-linux-x64@$OPENCODE"); fi
npm install --prefix "$dest/node" --no-audit --no-fund --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE" "@openai/codex@$CODEX" "opencode-ai@$OPENCODE" \
  "@qwen-code/qwen-code@$QWEN_CODE" "ai@$AI_SDK" "@ai-sdk/openai@$AI_SDK_OPENAI" "zod@$ZOD" \
  "${platform[@]}"
# Qwen Code ships its ripgrep without the executable bit (npm keeps the tarball's modes): it then
# warns on every run (EACCES) and falls back to a slower search of its own.
for rg in "$dest"/node/node_modules/@qwen-code/qwen-code/vendor/ripgrep/*/rg; do chmod +x "$rg"; done
for tool in aider llm; do
  python3 -m venv "$dest/$tool"
done
pip=(install -q --disable-pip-version-check)
"$dest/aider/bin/python" -m pip "${pip[@]}" "aider-chat==$AIDER"
"$dest/llm/bin/python" -m pip "${pip[@]}" "llm==$LLM"
echo "$want" > "$stamp"
