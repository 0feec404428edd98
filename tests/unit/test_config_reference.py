"""The configuration schema documents itself: every field has a description, docs/configuration.md
is the table rendered from them, and the environment variables it names are the ones read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_origin

import pytest
from pydantic_settings import EnvSettingsSource

from proxy.config.reference import SettingDoc, render_reference, setting_docs, summary
from proxy.config.settings import Settings, load_settings

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
DOCS = setting_docs()
ONE_LINE = 120  # characters: the meaning config.toml shows beside a key


@pytest.mark.parametrize("doc", DOCS, ids=[doc.key for doc in DOCS])
def test_every_setting_has_a_one_line_meaning(doc: SettingDoc) -> None:
    assert doc.description, f"{doc.key} has no description"
    assert len(summary(doc.description)) <= ONE_LINE, f"{doc.key}: first sentence too long"


def test_docs_table_is_rendered_from_the_schema() -> None:
    assert REFERENCE.read_text("utf-8") == render_reference(), (
        "docs/configuration.md differs from the schema: python -m proxy.config > "
        "docs/configuration.md"
    )


def _sample(annotation: object) -> tuple[str, object]:
    """An environment variable's text for a field of this type, and the value read from it (a
    list or a table is JSON; anything else stays text until validation)."""
    origin = get_origin(annotation)
    if origin is list:
        return "[]", []
    if origin is dict:
        return "{}", {}
    return "1", "1"


def _read_from(path: str, data: dict[str, object]) -> object:
    value: object = data
    for part in path.split("."):
        assert isinstance(value, dict) and part in value, f"{path}: nothing read at {part}"
        value = value[part]
    return value


@pytest.mark.parametrize(
    "doc", [d for d in DOCS if d.env_var and d.section is None], ids=lambda d: d.key
)
def test_the_environment_variable_named_sets_the_setting(
    doc: SettingDoc, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert doc.env_var is not None
    text, value = _sample(doc.field.annotation)
    monkeypatch.setenv(doc.env_var, text)
    read = EnvSettingsSource(Settings)()  # what pydantic-settings takes from the environment
    assert _read_from(doc.key, read) == value


def test_the_models_variable_replaces_the_whole_list(monkeypatch: pytest.MonkeyPatch) -> None:
    model = {"name": "other", "backend": "simulator", "profiles": [{"name": "off"}]}
    monkeypatch.setenv("MTP_PROXY_MODELS", json.dumps([model]))
    monkeypatch.setenv("MTP_PROXY_MODEL_NAMES__DEFAULT", "other")
    assert [m.name for m in load_settings(None).models] == ["other"]


def test_advanced_settings_name_fields_and_have_a_table_of_their_own() -> None:
    from proxy.config.routing import RoutingSettings

    advanced = RoutingSettings.advanced_fields
    assert advanced <= set(RoutingSettings.model_fields), advanced - set(
        RoutingSettings.model_fields
    )
    marked = {doc.name for doc in DOCS if doc.advanced}
    assert marked == advanced
    text = render_reference()
    user, _, rest = text.partition("### Advanced `[routing]` settings")
    advanced_table = rest.partition("\n## ")[0]
    for doc in DOCS:
        if doc.table == "routing":
            where = advanced_table if doc.advanced else user
            assert f"| `{doc.key}` |" in where, f"{doc.key} not in its table"
