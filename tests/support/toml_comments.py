"""Read a commented TOML example line by line: each key (set or commented out) and each table
header, with the table it belongs to and the comment that goes with it.

tomllib drops comments, and a commented-out key is a comment to it; config.toml documents
settings in both, so the tests read the file as text. One key per line, one-line values.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any

_HEADER = re.compile(r"^(\[\[?)\s*([A-Za-z0-9_.]+)\s*\]\]?$")
_KEY = re.compile(r"^[A-Za-z0-9_]+\s*=")


@dataclass(frozen=True)
class Entry:
    """A key or a table header of the file."""

    table: str  # the table it belongs to ("models.profiles"); for a header, the header's name
    key: str | None  # None for a header
    value: Any  # the parsed value (None for a header)
    commented: bool  # written as a comment ("# key = value")
    example: bool  # under a commented-out table header: an example, not the file's settings
    comment: str  # the comment lines right above it and its trailing comment, joined
    line: int  # 1-based

    @property
    def dotted(self) -> str:
        return self.table if self.key is None else f"{self.table}.{self.key}"


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment text) of one TOML line: the first # outside a string starts the comment."""
    quote: str | None = None
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif quote == '"' and char == "\\":
            escaped = True
        elif quote is not None:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#":
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def read_entries(text: str) -> list[Entry]:
    entries: list[Entry] = []
    table, example = "", False
    above: list[str] = []  # the comment lines since the last blank line, key or header
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            above = []
            continue
        commented = line.startswith("#")
        code, trailing = split_comment(line.lstrip("#").strip() if commented else line)
        comment = " ".join([*above, trailing]).strip()
        header = _HEADER.match(code)
        if header is not None:
            table, example = header.group(2), commented
            entries.append(Entry(table, None, None, commented, example, comment, number))
            above = []
            continue
        parsed = _key_value(code)
        if parsed is None:
            if not commented:
                raise ValueError(f"line {number}: neither a key, a header nor a comment: {raw!r}")
            above.append(line.lstrip("#").strip())
            continue
        key, value = parsed
        entries.append(Entry(table, key, value, commented, example, comment, number))
        above = []
    return entries


def _key_value(code: str) -> tuple[str, Any] | None:
    """(key, value) when `code` is one `key = value` line of TOML, else None (prose)."""
    if not _KEY.match(code):
        return None
    try:
        ((key, value),) = tomllib.loads(code).items()
    except (tomllib.TOMLDecodeError, ValueError):
        return None
    return key, value
