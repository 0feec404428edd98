"""The real-engine routing benchmark's traces: rounds of chat requests of six classes.

Each round holds one request of every class, built from proxy/workloads/texts.py and
deterministic for a seed:

- ``edit``: a short code edit: rename a name in a ~1 kB snippet given in a fenced block;
- ``new``: new code asked for in plain words ("Write a Python function that ...");
- ``copy``: a ~4 kB source file in a fenced block after an English lead-in, to be copied back
  with a name changed (a file given to copy or refactor);
- ``prose``: a passage to proofread, or a story to carry on;
- ``chat``: a short question, on odd rounds after an earlier exchange;
- ``agent``: one coding-agent session whose context grows by a tool result every round (the
  agent's system prompt, its task, then each earlier step's reply and tool output).

The intended content kind of each class (``INTENDED``) is what the proxy's classifier should
say (proxy/routing/features.py); the report puts the two side by side. Every request is a
greedy (temperature 0) chat completion of at most ``tokens`` tokens. A request's ``session``
is the client that sends it (bench/routing_replay.py sends a client's requests in order): one
client for the alone scenario, ``clients`` for the concurrent one. ``scale`` shrinks the texts
(the quick run's prefill on a busy CPU).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from proxy.workloads import texts
from proxy.workloads.trace import TraceRequest

MODEL = "gemma3-270m"
PATH = "/v1/chat/completions"
CLASSES = ("edit", "new", "copy", "prose", "chat", "agent")
INTENDED = {
    "edit": "code",
    "new": "code",
    "copy": "code",
    "prose": "prose",
    "chat": "prose",
    "agent": "code",
}
RENAMES = (("result", "totals"), ("limit", "cap"), ("items", "entries"), ("key", "name"))
AGENT_SYSTEM_CHARS = 5000  # the agent's system prompt, cut to keep a CPU's prefill short
COPY_CHARS = 4000
EDIT_CHARS = 600
PROSE_CHARS = 1400
TOOL_CHARS = 1500  # what each agent step adds: a file read, a grep, a test log


@dataclass(frozen=True)
class Item:
    """One request of a trace: its class, the content kind it is meant to be, the request."""

    cls: str
    request: TraceRequest

    @property
    def intended(self) -> str:
        return INTENDED[self.cls]


Round = list[Item]


def _body(messages: list[dict[str, str]], tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": tokens, "temperature": 0}


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _fenced(code: str) -> str:
    lang = "typescript" if code.startswith("import {") else "python"
    return f"```{lang}\n{code.rstrip()}\n```"


def edit_messages(rng: random.Random, r: int, scale: float = 1.0) -> list[dict[str, str]]:
    old, new = RENAMES[r % len(RENAMES)]
    code = texts.code_file(rng, int(EDIT_CHARS * scale))
    return _user(f"Rename `{old}` to `{new}` in this code and show it again:\n\n{_fenced(code)}")


def new_messages(rng: random.Random, r: int, scale: float = 1.0) -> list[dict[str, str]]:
    return _user(texts.CODE_QUESTIONS[(r + rng.randrange(2)) % len(texts.CODE_QUESTIONS)])


def copy_messages(rng: random.Random, r: int, scale: float = 1.0) -> list[dict[str, str]]:
    old, new = RENAMES[(r + 1) % len(RENAMES)]
    code = texts.code_file(rng, int(COPY_CHARS * scale))
    lead = (
        "This file comes from our billing service. We are renaming things across the code "
        f"base before the next release, and this file is next. Please rename `{old}` to "
        f"`{new}` everywhere in it and reply with the complete file, nothing else.\n\n"
    )
    return _user(lead + _fenced(code))


def prose_messages(rng: random.Random, r: int, scale: float = 1.0) -> list[dict[str, str]]:
    passage = texts.prose(rng, int(PROSE_CHARS * scale))
    if r % 2 == 0:
        ask = "Please proofread this passage from our newsletter and return it corrected:"
    else:
        ask = "Here is the start of a story. Write the next paragraph in the same style:"
    return _user(f"{ask}\n\n{passage}")


def chat_messages(rng: random.Random, r: int, scale: float = 1.0) -> list[dict[str, str]]:
    question = texts.PROSE_QUESTIONS[(r + rng.randrange(3)) % len(texts.PROSE_QUESTIONS)]
    if r % 2 == 0:
        return _user(question)
    earlier = texts.prose(rng, 300)
    followup = texts.PROSE_FOLLOWUPS[r % len(texts.PROSE_FOLLOWUPS)]
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": earlier},
        {"role": "user", "content": followup},
    ]


def agent_step(rng: random.Random, step: int, scale: float = 1.0) -> tuple[str, str]:
    """One earlier step of the agent: its reply, then the tool output it got."""
    noun = rng.choice(("orders", "invoices", "sessions", "reports"))
    chars = int(TOOL_CHARS * scale)
    if step % 3 == 0:
        code = _fenced(texts.code_file(rng, chars))
        return f"Let me read src/{noun}.py.", f"src/{noun}.py:\n{code}"
    if step % 3 == 1:
        return f"Searching for the callers of load_{noun}.", texts.grep_output(rng, chars // 80)
    return "Running the tests.", texts.test_log(rng, chars)


class AgentSession:
    """The agent's conversation so far; each ``turn`` adds one step and asks for the next."""

    def __init__(self, seed: int, scale: float = 1.0) -> None:
        self.rng = random.Random(seed)
        self.scale = scale
        system = texts.agent_system(self.rng, "mtp-bench")[: int(AGENT_SYSTEM_CHARS * scale)]
        task = texts.AGENT_TASKS[seed % len(texts.AGENT_TASKS)]
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]

    def turn(self, step: int) -> list[dict[str, str]]:
        reply, output = agent_step(self.rng, step, self.scale)
        self.messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": output},
        ]
        return list(self.messages)


BUILDERS = {
    "edit": edit_messages,
    "new": new_messages,
    "copy": copy_messages,
    "prose": prose_messages,
    "chat": chat_messages,
}


class Numbering:
    """Request indices unique across every trace of a run (the X-Request-Id the proxy logs)."""

    def __init__(self) -> None:
        self.next = 0

    def item(self, cls: str, client: str, messages: list[dict[str, str]], tokens: int) -> Item:
        request = TraceRequest(self.next, 0.0, client, PATH, _body(messages, tokens))
        self.next += 1
        return Item(cls, request)


def alone_rounds(
    rounds: int, seed: int, tokens: int, numbering: Numbering, scale: float = 1.0
) -> list[Round]:
    """One client, one request at a time: every class once a round, the agent's turn last."""
    agent = AgentSession(seed, scale)
    out: list[Round] = []
    for r in range(rounds):
        rng = random.Random(seed * 1000 + r)
        items = [
            numbering.item(cls, "alone", build(rng, r, scale), tokens)
            for cls, build in BUILDERS.items()
        ]
        items.append(numbering.item("agent", "alone", agent.turn(r), tokens))
        out.append(items)
    return out


def concurrent_rounds(
    rounds: int, seed: int, tokens: int, clients: int, numbering: Numbering, scale: float = 1.0
) -> list[Round]:
    """``clients`` clients at once: every class once a round plus a second edit and chat, dealt
    out in turn (the agent, the copy and the prose first), so each client sends two."""
    agent = AgentSession(seed, scale)
    order = ("agent", "copy", "edit", "prose", "new", "chat", "edit", "chat")
    out: list[Round] = []
    for r in range(rounds):
        rng = random.Random(seed * 1000 + r)
        items = []
        for i, cls in enumerate(order):
            messages = agent.turn(r) if cls == "agent" else BUILDERS[cls](rng, r + i, scale)
            items.append(numbering.item(cls, f"client-{i % clients}", messages, tokens))
        out.append(items)
    return out


def short_rounds(
    rounds: int, seed: int, tokens: int, numbering: Numbering, scale: float = 1.0
) -> list[Round]:
    """One client: the five one-shot classes once a round (the draft-simple control's trace)."""
    out: list[Round] = []
    for r in range(rounds):
        rng = random.Random(seed * 1000 + r)
        out.append(
            [numbering.item(cls, "alone", b(rng, r, scale), tokens) for cls, b in BUILDERS.items()]
        )
    return out
