"""The layers import one way: every import statement of the product (TYPE_CHECKING and local
imports included) is read from the source, and none may cross a rule below."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = [
    # (importer, imported): modules under the first never import modules under the second
    ("proxy.routing", "proxy.serving"),  # the brain reads its own views (routing/design.md)
    ("proxy.serving", "proxy.lifecycle"),
    ("proxy.serving", "proxy.cli"),
    ("proxy.observability", "proxy.serving"),
    ("proxy.observability", "proxy.lifecycle"),
    ("proxy.observability", "proxy.cli"),
    ("proxy.lifecycle", "proxy.cli"),
    ("proxy", "bench"),  # the product does not run its benchmarks
    ("supervisor", "proxy"),  # the supervisor knows nothing of HTTP routing
    ("simulator", "proxy"),
]


def imports_of(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names (``from a import b``: a and a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules_under(package: str) -> dict[str, Path]:
    folder = ROOT.joinpath(*package.split("."))
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts): path
        for path in folder.rglob("*.py")
    }


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize(("importer", "imported"), RULES, ids=lambda part: part)
def test_a_layer_does_not_import_what_is_above_it(importer: str, imported: str) -> None:
    crossing = sorted(
        f"{module} imports {name}"
        for module, path in modules_under(importer).items()
        for name in imports_of(path)
        if within(name, imported)
    )
    assert not crossing, crossing


def test_the_reader_sees_local_and_type_checking_imports(tmp_path: Path) -> None:
    # Guards the reader itself: one that missed these would let a crossing pass.
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from proxy.serving import backends\n"
        "def f():\n    import proxy.cli.main\n"
    )
    assert {"proxy.serving.backends", "proxy.cli.main"} <= imports_of(source)
