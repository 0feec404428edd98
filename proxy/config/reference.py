"""The configuration reference, rendered from the schema: every setting's key, type, default,
environment variable and description.

`python -m proxy.config` prints it; docs/configuration.md is that output, and a unit test keeps
the two equal. The same walk (`setting_docs`) lets the tests check config.toml's comments.
"""

from __future__ import annotations

import json
import re
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from proxy.config.settings import Settings

ENV_PREFIX = "MTP_PROXY_"
ENV_DELIMITER = "__"
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)[.?!](?=\s|$)")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_TYPE_NAMES: dict[object, str] = {SecretStr: "secret str", Path: "path"}


@dataclass(frozen=True)
class SettingDoc:
    """One field of the schema, where it is written in the TOML file, and how it is set."""

    key: str  # dotted: "server.port", "models.profiles.name"
    table: str  # the TOML table it is a key of: "server", "models.profiles"; "" at the top
    field: FieldInfo
    section: type[BaseModel] | None  # the model of the table this field is, if it is one
    array: bool  # the field is an array of tables ([[models]])
    env_var: str | None  # None inside an array of tables: only the whole array can be set
    advanced: bool = False  # named in its table model's ``advanced_fields``

    @property
    def name(self) -> str:
        return self.key.rpartition(".")[2]

    @property
    def description(self) -> str:
        return self.field.description or ""


def setting_docs(root: type[BaseModel] = Settings) -> list[SettingDoc]:
    """Every field of the schema, tables included, depth first in declaration order."""
    return list(_walk(root, "", ENV_PREFIX))


def _walk(model: type[BaseModel], table: str, env: str | None) -> Iterator[SettingDoc]:
    for name, field in model.model_fields.items():
        key = f"{table}.{name}" if table else name
        section, array = _section_of(field.annotation)
        env_var = f"{env}{name.upper()}" if env is not None else None
        advanced = name in getattr(model, "advanced_fields", frozenset())
        yield SettingDoc(key, table, field, section, array, env_var, advanced)
        if section is not None:
            inner = None if array or env_var is None else env_var + ENV_DELIMITER
            yield from _walk(section, key, inner)


def _section_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the table's model, is it an array of tables) of a field; (None, False): a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item, True
    return None, False


def summary(description: str) -> str:
    """The description's first sentence: the one line config.toml shows beside the key."""
    end = _SENTENCE_END.search(description)
    return description[: end.end()] if end else description


def default_text(field: FieldInfo) -> str:
    """The default as a TOML value; "unset" when the key is absent by default, or "required"."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    return "unset" if value is None else toml_value(value)


def toml_value(value: object) -> str:
    """`value` written as TOML, on one line."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, bool | int | float | str):
        return json.dumps(value, ensure_ascii=False)  # JSON's scalars are TOML's here
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        pairs = ", ".join(f"{_toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + pairs + " }" if pairs else "{}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def type_text(doc: SettingDoc) -> str:
    """The field's type in words, with its bounds: `int, >= 0, <= 65535`."""
    if doc.section is not None:
        return "array of tables" if doc.array else "table"
    words = [_annotation_text(doc.field.annotation)]
    for meta in doc.field.metadata:
        words += _bound_text(meta)
    return ", ".join(words)


def _annotation_text(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(arg) for arg in args)
    if origin in (Union, types.UnionType):
        return " | ".join(_annotation_text(arg) for arg in args if arg is not type(None))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_annotation_text(arg) for arg in args)}]"
    return _TYPE_NAMES.get(annotation) or str(getattr(annotation, "__name__", annotation))


def _bound_text(meta: object) -> list[str]:
    bounds = (
        (annotated_types.Ge, "ge", ">="),
        (annotated_types.Gt, "gt", ">"),
        (annotated_types.Le, "le", "<="),
        (annotated_types.Lt, "lt", "<"),
        (annotated_types.MinLen, "min_length", "length >="),
        (annotated_types.MaxLen, "max_length", "length <="),
    )
    for kind, attribute, word in bounds:
        if isinstance(meta, kind):
            return [f"{word} {getattr(meta, attribute)}"]
    pattern = getattr(meta, "pattern", None)
    return [f"matching {pattern}"] if pattern else []


_INTRO = """\
# Configuration reference

<!-- Generated by `python -m proxy.config` from the settings' descriptions in proxy/config/
     (and supervisor/settings.py); tests/unit/test_config_reference.py fails when this file
     differs. Edit the descriptions, then: python -m proxy.config > docs/configuration.md -->

mtp-proxy reads one TOML file (`--config FILE`; without it, the embedded demo). Every key below
is optional unless its default says "required"; "unset" means the key is left out (TOML has no
null). `config.toml` at the repository root shows every setting with its default.

Environment variables override the file: `MTP_PROXY_<TABLE>__<KEY>`, e.g.
`MTP_PROXY_SERVER__PORT=9000`. A list or table value is written as JSON, e.g.
`MTP_PROXY_SERVER__API_KEYS='["sk-1"]'`. An array of tables has no per-key variable:
`MTP_PROXY_MODELS` replaces the whole `[[models]]` list (JSON).
"""


def render_reference() -> str:
    """docs/configuration.md: one table of settings per TOML table, in the schema's order."""
    parts = [_INTRO]
    for doc in setting_docs():
        if doc.section is not None:
            parts.append(_render_table(doc))
    return "\n".join(parts)


_ADVANCED_NOTE = (
    "The policy's research knobs: their defaults are what the routing benchmark chose, and "
    "config.toml marks each (advanced). They sit in the same TOML table as the keys above; "
    "change one only to measure its effect (`python -m bench.routing`, docs/benchmarks.md)."
)
_HEAD = ["| Key | Type | Default | Environment variable | Meaning |", "|---|---|---|---|---|"]


def _render_table(table: SettingDoc) -> str:
    """The table's settings; its advanced ones, if any, in a second table under them."""
    header = f"[[{table.key}]]" if table.array else f"[{table.key}]"
    docs = [doc for doc in setting_docs() if doc.table == table.key]
    lines = [f"## `{header}`", "", _cell(table.description), "", *_HEAD]
    lines += [_row(doc) for doc in docs if not doc.advanced]
    advanced = [_row(doc) for doc in docs if doc.advanced]
    if advanced:
        lines += ["", f"### Advanced `{header}` settings", "", _ADVANCED_NOTE, "", *_HEAD]
        lines += advanced
    return "\n".join(lines) + "\n"


def _row(doc: SettingDoc) -> str:
    env = f"`{doc.env_var}`" if doc.env_var else "-"
    default = default_text(doc.field)
    shown = default if default in ("required", "unset") else _code(default)
    cells = [f"`{doc.key}`", _code(type_text(doc)), shown, env]
    return "| " + " | ".join([*cells, _cell(doc.description)]) + " |"


def _code(text: str) -> str:
    return f"`{_cell(text)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
