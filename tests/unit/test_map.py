"""The maps in proxy/__init__.py and proxy/routing/__init__.py name every module of their package
once, one ``- ``name``: what it holds`` line each, and nothing that is not a module."""

from __future__ import annotations

import importlib.util
import pkgutil
import re
from types import ModuleType

import pytest

import proxy
import proxy.routing

MAPS = [proxy, proxy.routing]
_ENTRY = re.compile(r"^- ``([\w.]+)``: \S", re.MULTILINE)
_REFERENCE = re.compile(r"``(proxy(?:\.\w+)+)``")


def modules_of(package: ModuleType) -> set[str]:
    """Every module (not package) below ``package``, named relative to it."""
    prefix = package.__name__ + "."
    found = pkgutil.walk_packages(package.__path__, prefix)
    return {info.name.removeprefix(prefix) for info in found if not info.ispkg}


def entries_of(package: ModuleType) -> list[str]:
    return _ENTRY.findall(package.__doc__ or "")


@pytest.mark.parametrize("package", MAPS, ids=lambda p: p.__name__)
def test_the_map_names_every_module(package: ModuleType) -> None:
    missing = modules_of(package) - set(entries_of(package))
    assert not missing, f"modules of {package.__name__} missing from its map: {sorted(missing)}"


@pytest.mark.parametrize("package", MAPS, ids=lambda p: p.__name__)
def test_the_map_names_only_modules(package: ModuleType) -> None:
    unknown = set(entries_of(package)) - modules_of(package)
    assert not unknown, f"{package.__name__}'s map names what is not a module: {sorted(unknown)}"


@pytest.mark.parametrize("package", MAPS, ids=lambda p: p.__name__)
def test_the_map_names_each_module_once(package: ModuleType) -> None:
    entries = entries_of(package)
    twice = sorted({name for name in entries if entries.count(name) > 1})
    assert not twice, f"{package.__name__}'s map names these more than once: {twice}"


@pytest.mark.parametrize("package", MAPS, ids=lambda p: p.__name__)
def test_the_modules_a_map_points_to_exist(package: ModuleType) -> None:
    references = _REFERENCE.findall(package.__doc__ or "")
    gone = [name for name in references if importlib.util.find_spec(name) is None]
    assert not gone, f"{package.__name__}'s map points to modules that do not exist: {gone}"


def test_the_walk_sees_the_modules_below_subpackages() -> None:
    # Guards the walk itself: a walk that saw only the top level would let every map pass.
    assert {"app", "serving.exchange", "routing.policy", "tune.measure.reading"} <= modules_of(
        proxy
    )
