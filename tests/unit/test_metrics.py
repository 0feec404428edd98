"""The metrics' registry is the app's own, never a global one (/metrics after real traffic:
tests/proxy/test_metrics.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from proxy.app import create_app
from proxy.config.settings import load_settings


def test_each_app_registers_on_the_registry_it_is_given() -> None:
    # No global registry: two apps in one process (as in tests) each own their series.
    settings = load_settings(None)
    first, second = CollectorRegistry(), CollectorRegistry()
    create_app(settings, registry=first)
    create_app(settings, registry=second)
    for registry in (first, second):
        names = {family.name for family in registry.collect()}
        assert {"mtp_proxy_requests", "mtp_proxy_backend_state"} <= names
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        create_app(settings, registry=first)
