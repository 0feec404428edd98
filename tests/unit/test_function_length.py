"""No function of the product (proxy/, supervisor/, simulator/) is over 60 lines, read from the
source, docstring included.

Two kinds are exempt, by what their body holds rather than by name, so that a builder which
grows a branch loses its exemption: an argparse builder (every statement makes a parser, a group
or a subparser, adds an argument, sets defaults, or returns the parser) and a metric declaration
(every statement assigns a prometheus_client metric, or names a constant such as a prefix). A
long list of flags or metrics reads as a table, and cutting it in pieces would hide none of its
logic."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("proxy", "supervisor", "simulator")
MAX_LINES = 60

_PARSER_CALLS = {
    "ArgumentParser",
    "add_argument",
    "add_argument_group",
    "add_mutually_exclusive_group",
    "add_parser",
    "add_subparsers",
    "set_defaults",
}
_METRIC_CALLS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _called(node: ast.expr | None) -> str | None:
    """The name a call calls (``x.add_argument(...)``: add_argument), None if not a call."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _is_table_row(statement: ast.stmt, calls: set[str]) -> bool:
    """One line of a builder's table: a call of ``calls`` (bare or assigned), a constant
    assigned, or the return of a name."""
    if isinstance(statement, ast.Expr):
        return _called(statement.value) in calls or isinstance(statement.value, ast.Constant)
    if isinstance(statement, ast.Assign | ast.AnnAssign):
        value = statement.value
        return _called(value) in calls or isinstance(value, ast.Constant)
    return isinstance(statement, ast.Return) and isinstance(statement.value, ast.Name)


def exempt(function: Function) -> bool:
    """An argparse builder or a metric declaration: every statement a row of its table."""
    return any(
        all(_is_table_row(statement, calls) for statement in function.body)
        for calls in (_PARSER_CALLS, _METRIC_CALLS)
    )


def length(function: Function) -> int:
    assert function.end_lineno is not None
    return function.end_lineno - function.lineno + 1


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length(node)} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and length(node) > MAX_LINES
        and not exempt(node)
    ]


@pytest.mark.parametrize("folder", PRODUCT)
def test_no_function_of_the_product_is_over_60_lines(folder: str) -> None:
    paths = sorted((ROOT / folder).rglob("*.py"))
    found = [line for path in paths for line in long_functions(path)]
    assert not found, found


def _only_function(source: str) -> Function:
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    return node


def test_the_exemption_covers_builders_and_metric_tables_only() -> None:
    # Guards the rule itself: one that exempted everything would let every long function pass.
    parser = "def f():\n    p = argparse.ArgumentParser()\n    p.add_argument('-x')\n    return p\n"
    metrics = "def f(self, r):\n    p = 'x_'\n    self.a = Counter(p + 'a', 'A.', registry=r)\n"
    logic = "def f(p):\n    p.add_argument('-x')\n    if p:\n        p.add_argument('-y')\n"
    mixed = "def f(self):\n    self.a = Counter('a', 'A.')\n    p.add_argument('-x')\n"
    assert exempt(_only_function(parser)) and exempt(_only_function(metrics))
    assert not exempt(_only_function(logic)) and not exempt(_only_function(mixed))
