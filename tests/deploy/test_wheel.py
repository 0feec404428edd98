"""The wheel is the product alone: no benchmarks, no traces, and nothing in it imports bench/.

The wheel is built from a copy of the checkout (the build writes build/ and *.egg-info where it
runs), then unpacked; its modules are imported from there, with bench/ made unimportable.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
PRODUCT = ("proxy", "supervisor", "simulator")
_NOT_SOURCE = {"__pycache__", "build", "dist", "state"}

# Runs in a fresh interpreter from the unpacked wheel: imports every module and loads the
# console script's function, with a finder in front that refuses (and records) bench.
_IMPORT_ALL = """
import importlib, json, pkgutil, sys

class NoBench:
    tried = []

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "bench":
            NoBench.tried.append(name)
            raise ImportError(f"the product imports {name}")
        return None

sys.meta_path.insert(0, NoBench())
site, entry, tops = sys.argv[1], sys.argv[2], sys.argv[3:]

def fail(name):
    raise ImportError(f"cannot import {name}")

names = []
for top in tops:
    package = importlib.import_module(top)
    assert package.__file__.startswith(site), (top, package.__file__)
    names.append(top)
    for info in pkgutil.walk_packages(package.__path__, top + ".", onerror=fail):
        if info.name.rsplit(".", 1)[-1] != "__main__":  # importing it would run the program
            importlib.import_module(info.name)
            names.append(info.name)
module, _, attr = entry.partition(":")
assert callable(getattr(importlib.import_module(module), attr))
bench = sorted(m for m in sys.modules if m.split(".")[0] == "bench")
print(json.dumps({"modules": names, "bench": bench, "tried": NoBench.tried}))
"""


def _not_source(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n.startswith(".") or n in _NOT_SOURCE or n.endswith(".egg-info")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source") / "mtp-proxy"
    shutil.copytree(CHECKOUT, source, ignore=_not_source)
    out = tmp_path_factory.mktemp("dist")
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    done = subprocess.run(
        [*argv, "-w", str(out), str(source)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("mtp_proxy-*.whl")
    return built


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel unpacked, as pip would lay it in site-packages."""
    folder = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder)
    return folder


def test_the_wheel_holds_the_product_and_its_data_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == set(PRODUCT)
    assert not [name for name in names if name.endswith(".jsonl")]
    # The data the product needs at run time is in it.
    assert "proxy/config/default.toml" in names
    assert {f"proxy/ui/static/{f}" for f in ("index.html", "app.js", "app.css", "icon.svg")} <= set(
        names
    )
    assert any(name.startswith("simulator/presets/") for name in names)
    assert "proxy/workloads/trace.py" in names and "proxy/workloads/texts.py" in names


def test_the_console_script_is_the_cli(site: Path) -> None:
    (info,) = site.glob("mtp_proxy-*.dist-info")
    scripts = (info / "entry_points.txt").read_text()
    assert "mtp-proxy = proxy.cli.main:main" in scripts.splitlines()


def test_every_module_of_the_wheel_imports_without_bench(site: Path, tmp_path: Path) -> None:
    argv = [sys.executable, "-c", _IMPORT_ALL, str(site), "proxy.cli.main:main", *PRODUCT]
    # cwd: not the checkout, whose bench/ would be importable from there.
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert (result["bench"], result["tried"]) == ([], [])
    assert {"proxy.cli.main", "proxy.tune.plan.workload", "proxy.workloads.trace"} <= set(
        result["modules"]
    )
    on_disk = [p for top in PRODUCT for p in (site / top).rglob("*.py") if p.stem != "__main__"]
    assert len(result["modules"]) == len(on_disk)  # every module was imported


def test_no_module_of_the_wheel_imports_bench_even_lazily(site: Path) -> None:
    """The import run above misses an import inside a function; the source shows it."""
    offenders = []
    for path in (p for top in PRODUCT for p in (site / top).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            bench = [m for m in modules if m.partition(".")[0] == "bench"]
            offenders += [f"{path.relative_to(site)}: {m}" for m in bench]
    assert offenders == []
