"""Generated text for workloads: source files, prose documents, tool output, chat questions.

tune's built-in workload is made of it, and so are the routing benchmark's traces.

Deterministic for a given ``random.Random``. Prose avoids the markers the simulator counts as
code (``class ``, ``import ``, ``return `` ...), so a document is prose to both the proxy and the
simulator; source files are unmistakably code.
"""

from __future__ import annotations

import random
from typing import Any

_NOUNS = (
    "order", "user", "frame", "token", "row", "event", "page", "job", "invoice", "record",
    "session", "message", "bucket", "cursor", "report", "ticket", "route", "shard", "lease",
)  # fmt: skip
_VERBS = ("load", "parse", "merge", "count", "render", "fetch", "store", "check", "build", "sync")

_PY_BLOCK = '''def {verb}_{noun}s(items: list[dict[str, int]], limit: int = {n}) -> dict[str, int]:
    """{Verb} the {noun}s that stay under the limit, keyed by group."""
    result: dict[str, int] = {{}}
    for i, item in enumerate(items):
        if item.get("size", 0) > limit:
            continue
        key = f"{noun}-{{i % {m}}}"
        result[key] = result.get(key, 0) + item["size"]
    return result


class {Noun}{Verb}er:
    def __init__(self, path: str, retries: int = {m}) -> None:
        self.path = path
        self.retries = retries
        self._cache: dict[str, bytes] = {{}}

    def {verb}(self, key: str) -> bytes:
        if key not in self._cache:
            with open(self.path + "/" + key, "rb") as f:
                self._cache[key] = f.read()
        return self._cache[key]

'''
_TS_BLOCK = """export function {verb}{Noun}s(items: {Noun}[], limit = {n}): Map<string, number> {{
  const result = new Map<string, number>();
  items.forEach((item, i) => {{
    if (item.size > limit) {{
      return;
    }}
    const key = `{noun}-${{i % {m}}}`;
    result.set(key, (result.get(key) ?? 0) + item.size);
  }});
  return result;
}};

export const {verb}{Noun}Handler = async (req: Request): Promise<Response> => {{
  const body = await req.json();
  if (!Array.isArray(body.items)) {{
    return new Response("bad request", {{ status: 400 }});
  }}
  return Response.json(Object.fromEntries({verb}{Noun}s(body.items)));
}};

"""
_PY_HEADER = "import json\nimport os\nfrom dataclasses import dataclass\n\n\n"
_TS_HEADER = 'import {{ {Noun} }} from "./types";\nimport {{ log }} from "./log";\n\n'

_WORDS = (
    "the", "a", "river", "village", "council", "winter", "harvest", "road", "bridge", "school",
    "letter", "morning", "market", "teacher", "family", "garden", "season", "history", "story",
    "people", "town", "year", "north", "summer", "old", "new", "quiet", "long", "small", "great",
    "travelled", "argued", "agreed", "wrote", "remembered", "built", "repaired", "described",
    "and", "but", "while", "because", "after", "before", "during", "with", "without", "of", "to",
    "in", "on", "near", "across", "under", "many", "several", "few", "every", "their", "its",
    "farmers", "merchants", "children", "visitors", "records", "debates", "meetings", "maps",
    "careful", "patient", "familiar", "distant", "modest", "honest", "sudden", "gentle",
)  # fmt: skip
_TOPICS = (
    "the history of the northern trade routes", "the rebuilding of the harbour district",
    "the quarterly review of the regional libraries", "the oral histories of the valley towns",
    "the new transport plan for the county", "the annual report of the water board",
)  # fmt: skip

PROSE_QUESTIONS = (
    "Hi! What is a good name for a grey cat?",
    "Can you explain how tides work, in simple words?",
    "Give me three tips for a job interview tomorrow.",
    "Translate 'good morning, how are you' into Spanish and French.",
    "Summarize the plot of Hamlet in a few sentences.",
    "How do I keep basil alive indoors over the winter?",
    "What is the difference between weather and climate?",
    "Write a short poem about autumn rain.",
    "Which is healthier for breakfast, oats or eggs? Why?",
    "Help me write a polite email asking my landlord to fix the heating.",
    "What are some good books for learning about ancient Rome?",
    "Plan a three day trip to Lisbon for me.",
)
PROSE_FOLLOWUPS = (
    "Thanks! Can you make it shorter?",
    "Tell me more about the second point.",
    "Why is that?",
    "Can you give an example?",
    "Great, and what would you recommend for a beginner?",
)
CODE_QUESTIONS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Implement binary search in JavaScript, with a short test.",
    "Write a bash script that renames all .txt files in a folder to .md.",
    "Fix the bug in this function:\n```python\ndef mean(xs):\n"
    "    return sum(xs) / len(xs) + 1\n```",
    "Refactor this code to use a dataclass:\n```python\nclass P:\n    def __init__(self, x, y):\n"
    "        self.x = x\n        self.y = y\n```",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Implement an LRU cache class in Python with get and put.",
    "Write a TypeScript function that debounces another function.",
)
CODE_FOLLOWUPS = (
    "Can you add type hints and a docstring?",
    "Now write unit tests for it.",
    "Make it handle empty input too.",
    "Fix the code so it also works on Windows paths.",
)
AGENT_TASKS = (
    "The test test_parse_dates in tests/test_report.py fails since the last merge. Find out why "
    "and fix it; run the tests afterwards.",
    "Add a --dry-run option to the sync command that prints what would change without writing.",
    "The invoice export is slow for large accounts. Profile it and make it at least 2x faster.",
    "Refactor the session store so that it uses the new cache interface; keep the behaviour.",
    "Users report a crash when the config file is empty. Reproduce it, fix it and add a test.",
)

_AGENT_RULES = (
    "You are an interactive coding agent that helps the user with software engineering tasks in "
    "their repository. Use the tools available to you to read files, search the codebase, edit "
    "files and run shell commands in the terminal.",
    "Before you edit a file, read it with the Read tool. Prefer small, focused diffs that keep "
    "the existing style of the code; do not reformat code you did not change.",
    "Run the tests after each edit. If a command fails, read its output carefully and fix the "
    "cause rather than the symptom. Never commit to git unless the user asks you to.",
    "Keep your answers short: the user sees them in a terminal. Use Markdown code fences for "
    "code, with the language named. Refer to code as path:line so the user can jump to it.",
    "When a task is ambiguous, look at the repository first: the answer is often in the code, "
    "the tests or the documentation. Ask the user only when the code cannot tell you.",
    "Security: never print secrets, tokens or keys that you find in files or environment "
    "variables, and refuse to write code whose purpose is to cause harm.",
    "Tool use: call several independent tools in one turn when you can (for example reading "
    "three files at once). Use Grep to search file contents and Glob to find files by name.",
    "Shell: commands run in a sandbox with the repository as the working directory. Long-running "
    "commands time out after two minutes; run servers in the background.",
)


def _fill(template: str, rng: random.Random) -> str:
    noun, verb = rng.choice(_NOUNS), rng.choice(_VERBS)
    return template.format(
        noun=noun,
        Noun=noun.capitalize(),
        verb=verb,
        Verb=verb.capitalize(),
        n=rng.randint(10, 999),
        m=rng.randint(2, 9),
    )


def code_file(rng: random.Random, chars: int) -> str:
    """A Python or TypeScript source file of about ``chars`` characters."""
    python = rng.random() < 0.6
    parts = [_fill(_PY_HEADER if python else _TS_HEADER, rng)]
    total = len(parts[0])
    block = _PY_BLOCK if python else _TS_BLOCK
    while total < chars:
        parts.append(_fill(block, rng))
        total += len(parts[-1])
    return "".join(parts)


def prose(rng: random.Random, chars: int) -> str:
    """Paragraphs of plain narrative prose, about ``chars`` characters."""
    paragraphs: list[str] = []
    total = 0
    while total < chars:
        sentences = []
        for _ in range(rng.randint(3, 7)):
            words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 22))]
            sentences.append(" ".join(words).capitalize() + rng.choice((".", ".", ".", "?", "!")))
        paragraphs.append(" ".join(sentences))
        total += len(paragraphs[-1]) + 2
    return "\n\n".join(paragraphs)


def document(rng: random.Random, chars: int) -> tuple[str, str]:
    """A long prose document with a title: (title, text)."""
    title = rng.choice(_TOPICS).capitalize()
    sections = []
    for n in range(1, 1 + max(1, chars // 6000)):
        sections.append(f"Section {n}\n\n{prose(rng, 6000)}")
    return title, f"{title}\n\n" + "\n\n".join(sections)


def test_log(rng: random.Random, chars: int) -> str:
    """pytest output with a failure and a traceback."""
    lines = ["============================= test session starts =============================="]
    n = 0
    while sum(len(x) + 1 for x in lines) < chars:
        n += 1
        name = f"tests/test_{rng.choice(_NOUNS)}.py::test_{rng.choice(_VERBS)}_{n}"
        lines.append(f"{name} {'FAILED' if rng.random() < 0.1 else 'PASSED'}")
    lines += [
        "=================================== FAILURES ===================================",
        '    assert result == {"order-1": 12}',
        "E   AssertionError: assert {'order-1': 13} == {'order-1': 12}",
        f"FAILED tests/test_report.py::test_parse_dates - AssertionError ({n} tests ran)",
    ]
    return "\n".join(lines)


def grep_output(rng: random.Random, lines: int) -> str:
    out = []
    for _ in range(lines):
        noun, verb = rng.choice(_NOUNS), rng.choice(_VERBS)
        out.append(
            f"src/{noun}s/{verb}.py:{rng.randint(1, 900)}:    result = {verb}_{noun}s(items)"
        )
    return "\n".join(out)


def agent_system(rng: random.Random, harness: str) -> str:
    """An agent harness's system prompt (~10k chars), headed by the session's environment."""
    project = f"{rng.choice(_NOUNS)}-{rng.choice(_VERBS)}er-{rng.randint(1, 999)}"
    env = (
        f"Working directory: /home/dev/src/{project}\nIs a git repository: true\n"
        f"Platform: linux\nToday's date: 2026-05-{rng.randint(10, 28)}\nHarness: {harness}\n\n"
    )
    return env + "\n\n".join(_AGENT_RULES * 4)


_TOOL_SPECS = (
    ("Read", "Read a file from the local filesystem. Returns the content with line numbers.",
     {"file_path": "Absolute path of the file to read.", "offset": "First line to read."}),
    ("Edit", "Replace an exact string in a file with another. The old string must be unique.",
     {"file_path": "Absolute path.", "old_string": "Text to replace.", "new_string": "New."}),
    ("Write", "Write a file, replacing any content it had. Prefer Edit for existing files.",
     {"file_path": "Absolute path.", "content": "The complete new content of the file."}),
    ("Bash", "Run a shell command in the repository and return its output and exit code.",
     {"command": "The command line.", "timeout": "Seconds before the command is killed."}),
    ("Grep", "Search file contents with a regular expression (ripgrep syntax).",
     {"pattern": "The regular expression.", "path": "Folder or file to search."}),
    ("Glob", "Find files whose path matches a glob pattern such as src/**/*.py.",
     {"pattern": "The glob pattern.", "path": "Folder to search from."}),
)  # fmt: skip


def tools(api: str) -> list[dict[str, Any]]:
    """The agent's tool definitions in the request format of ``api``."""
    out: list[dict[str, Any]] = []
    for name, description, params in _TOOL_SPECS:
        schema = {
            "type": "object",
            "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
            "required": [next(iter(params))],
        }
        text = description + " " + description.lower()
        if api == "messages":
            out.append({"name": name, "description": text, "input_schema": schema})
        elif api == "responses":
            out.append(
                {"type": "function", "name": name, "description": text, "parameters": schema}
            )
        else:
            out.append(
                {
                    "type": "function",
                    "function": {"name": name, "description": text, "parameters": schema},
                }
            )
    return out
