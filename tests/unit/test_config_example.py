"""config.toml, the documented example: every setting of the schema shown with its default and
the first sentence of its description, and nothing the schema does not know."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import SecretStr

from proxy.config.reference import SettingDoc, default_text, setting_docs, summary
from tests.support.toml_comments import Entry, read_entries

EXAMPLE = Path(__file__).resolve().parents[2] / "config.toml"
DOCS = setting_docs()
ENTRIES = read_entries(EXAMPLE.read_text("utf-8"))
_DEFAULT_NOTE = re.compile(r"\(default: (.+?)\)")


def first_shown(doc: SettingDoc) -> Entry | None:
    """Where config.toml documents `doc`: its first key line (set or commented out) or, for a
    table, its first header; examples under a commented-out header do not count."""
    for entry in ENTRIES:
        if entry.example:
            continue
        if doc.section is not None and entry.key is None and entry.table == doc.key:
            return entry
        if doc.section is None and entry.key == doc.name and entry.table == doc.table:
            return entry
    return None


def plain(value: object) -> object:
    """A default as TOML reads it back: secrets and paths are strings."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def default_problem(doc: SettingDoc, entry: Entry) -> str | None:
    """Why the value shown is not the default (None: it is, or says "(default: ...)")."""
    if doc.field.is_required():
        return None
    expected = default_text(doc.field)
    note = _DEFAULT_NOTE.search(entry.comment)
    if note is not None:
        shown = note.group(1)
        return None if shown == expected else f"says (default: {shown}), the schema {expected}"
    default = doc.field.get_default(call_default_factory=True)
    if default is None:
        return None if entry.commented else "is set but unset by default: say (default: unset)"
    if entry.value != plain(default):
        return f"shows {entry.value!r}, the default is {expected}: say (default: {expected})"
    return None


def words(text: str) -> str:
    return " ".join(text.split())


def test_every_setting_is_shown() -> None:
    missing = [doc.key for doc in DOCS if first_shown(doc) is None]
    assert missing == [], f"config.toml does not show: {', '.join(missing)}"


def test_every_key_shown_is_a_setting() -> None:
    known = {doc.key for doc in DOCS}
    unknown = [f"line {e.line}: {e.dotted}" for e in ENTRIES if e.dotted not in known]
    assert unknown == []


@pytest.mark.parametrize("doc", DOCS, ids=[doc.key for doc in DOCS])
def test_each_setting_shows_its_meaning_and_default(doc: SettingDoc) -> None:
    entry = first_shown(doc)
    assert entry is not None, f"config.toml does not show {doc.key}"
    meaning = words(summary(doc.description))
    assert meaning in words(entry.comment), f"line {entry.line}: comment lacks {meaning!r}"
    if doc.section is None:
        problem = default_problem(doc, entry)
        assert problem is None, f"line {entry.line}: {doc.key} {problem}"


@pytest.mark.parametrize("doc", [d for d in DOCS if d.section is None], ids=lambda d: d.key)
def test_an_advanced_setting_says_so_and_no_other_does(doc: SettingDoc) -> None:
    entry = first_shown(doc)
    assert entry is not None
    said = words(entry.comment).startswith("(advanced)")
    assert said == doc.advanced, f"line {entry.line}: {doc.key} advanced={doc.advanced}"
