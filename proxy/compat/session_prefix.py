"""The start of Claude Code's prompt, made the same in every session of the same directory.

Claude Code's first system block is a billing header, e.g.
``x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;``. The three hex
digits after the version are derived from the session's first prompt (the same prompt gives the
same digits in any session), so two sessions with different first prompts differ at the first
system line: right after the tools, before the whole ~40k-token agent prompt, which then has to
be prefilled again for every new session (and for each compaction request, which hashes its own
prompt). Nothing in those digits means anything to a local model. The mend writes them as
``fff``, and the ``cch=`` stamp some versions add as ``fffff`` (what llama-server itself does to
``cch=``, ggml-org/llama.cpp#21793), in the Messages ``system`` text or its first text block.
Only a header of exactly that form is touched.
"""

from __future__ import annotations

import re
from typing import Any

HEADER = "x-anthropic-billing-header:"
# The header's own line, up to the text that follows it (older versions put the prompt right
# after the last ';').
_VERSION = re.compile(r"(cc_version=\d+\.\d+\.\d+\.)([0-9a-f]{3})(;)")
_CCH = re.compile(r"(cch=)([0-9a-f]{5})(;)")


def mend_session_prefix(body: dict[str, Any]) -> dict[str, Any]:
    """The body with its billing header's per-session digits made constant; the same object
    when it has none to change."""
    system = body.get("system")
    if isinstance(system, str):
        fixed = normalized_header(system)
        return body if fixed == system else {**body, "system": fixed}
    if not isinstance(system, list) or not system:
        return body
    first = system[0]
    if not isinstance(first, dict) or first.get("type") != "text":
        return body
    text = first.get("text")
    if not isinstance(text, str):
        return body
    fixed = normalized_header(text)
    if fixed == text:
        return body
    return {**body, "system": [{**first, "text": fixed}, *system[1:]]}


def normalized_header(text: str) -> str:
    """`text` with the billing header's digits constant, if it starts with that header."""
    if not text.startswith(HEADER):
        return text
    line_end = text.find("\n")
    head, tail = (text, "") if line_end < 0 else (text[:line_end], text[line_end:])
    head = _VERSION.sub(lambda m: m[1] + "fff" + m[3], head, count=1)
    head = _CCH.sub(lambda m: m[1] + "fffff" + m[3], head, count=1)
    return head + tail
