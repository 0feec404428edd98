"""Mends: what the proxy changes in a request (or an error) so that llama-server serves it as the
client meant. One module per mend, each a pure function from a parsed body to a body; the
``[compat]`` settings switch them (proxy.config.settings.CompatSettings).

- system_turns: system/developer messages that are not first, for a backend whose chat template
  refuses them (supervisor.template_check): the leading ones merged, later ones in place as
  ``<system-reminder>`` user messages, so every earlier prompt byte stays put (prefix cache).
- input_items: Responses input items with a role and no ``type``; reasoning items without content.
- text_format: Responses ``text.format`` -> the top-level ``response_format`` llama-server enforces.
- output_format: Messages ``output_config.format``, which llama-server drops: a 400 naming it.
- codex_tools: Codex's ``additional_tools`` input item -> the request's own tools, and the answer's
  calls back into the shape Codex dispatches (custom tool calls, namespaces).
- session_prefix: Claude Code's billing header, which differs between sessions, made constant.
- overflow: llama-server's context overflow 400 -> each API's canonical error.
- request: applies them to one request, parsing nothing and copying nothing when none applies.
"""
