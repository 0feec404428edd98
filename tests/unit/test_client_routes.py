"""Which model a client's model name resolves to: alias, pattern, default, the only model (the
routes clients call: tests/proxy/test_client_routes.py)."""

from __future__ import annotations

from proxy.config.model_names import ModelNameSettings
from proxy.config.settings import ModelSettings
from proxy.serving.model_names import ModelCatalog


def test_catalog_resolution_order() -> None:
    models = [
        ModelSettings(name="a", aliases=["a-alias"], backend="simulator", profiles=[{"name": "p"}]),
        ModelSettings(name="b", backend="simulator", profiles=[{"name": "p"}]),
    ]
    names = ModelNameSettings(default="b", patterns={"claude-*": "a", "claude-haiku-*": "b"})
    catalog = ModelCatalog(models, names)
    assert catalog.resolve("a-alias") == "a"
    assert catalog.resolve("claude-haiku-4-5") == "a"  # first matching pattern wins
    assert catalog.resolve("gpt-5") == "b"  # the default
    assert catalog.resolve(None) == "b"
    assert catalog.resolve(42) is None
    strict = ModelCatalog(models, ModelNameSettings(patterns={"claude-*": "a"}))
    assert (strict.resolve("gpt-5"), strict.resolve(None)) == (None, None)  # two models, no default
    assert ModelCatalog(models[:1]).resolve(None) == "a"  # the only model
