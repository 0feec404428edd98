"""The ``[side_requests]`` section: which requests are an agent's side requests (a title, a
haiku call) and the llama-server slot kept for them, so they never take the slot that holds the
agent's long prompt (proxy.serving.side_requests)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SideRequestSettings(BaseModel):
    """Side requests and the slot reserved for them. Each rule is a setting: a request is a
    side request when its model name matches ``model_pattern``, or when it meets every shape
    rule that is on (``no_tools``, ``max_tokens``, ``other_session``)."""

    model_config = ConfigDict(extra="forbid")

    slot: int | None = Field(
        default=None,
        ge=0,
        description="The llama-server slot (id_slot) kept for side requests; unset: none kept. "
        "A backend with more slots than this sends each side request there; with two slots "
        "the other requests go to the other one, so the agent's prompt cache stays in it. "
        "init writes 1 with -np 2 where the memory allows.",
    )
    model_pattern: str | None = Field(
        default="*-haiku-*",
        description="A side request by its model name (the client's, shell-style pattern): "
        "Claude Code's small fast model, claude-haiku-*. Unset: no name rule.",
    )
    max_tokens: int | None = Field(
        default=1024,
        ge=1,
        description="Shape rule: a side request asks for at most this many tokens (a title, a "
        "summary line). Unset: the rule is off.",
    )
    no_tools: bool = Field(
        default=True,
        description="Shape rule: a side request offers no tools (an agent's turn does).",
    )
    other_session: bool = Field(
        default=True,
        description="Shape rule: a side request's session key is none or not the live agent's. "
        "The live agent: the session of the model's last turn with tools.",
    )
