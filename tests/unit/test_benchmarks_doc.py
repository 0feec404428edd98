"""docs/benchmarks.md stays a short page of reproducible tables: under 300 lines, and every table
preceded, within its section, by the `python -m bench.` command that makes it."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
MAX_LINES = 300
COMMAND = "python -m bench."


def sections(lines: list[str]) -> list[list[str]]:
    """The page cut at every heading (a line starting with `#` outside a code block)."""
    out: list[list[str]] = [[]]
    fenced = False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        if line.startswith("#") and not fenced:
            out.append([])
        out[-1].append(line)
    return out


def tables_without_command(section: list[str]) -> list[str]:
    """The first row of each table in the section with no command above it in the section."""
    missing = []
    for i, line in enumerate(section):
        starts_table = line.startswith("|") and (i == 0 or not section[i - 1].startswith("|"))
        if starts_table and COMMAND not in "\n".join(section[:i]):
            missing.append(f"{section[0]!r}: {line}")
    return missing


def test_the_page_stays_under_its_line_budget() -> None:
    count = len(DOCS.read_text().splitlines())
    assert count < MAX_LINES, f"docs/benchmarks.md has {count} lines; the rule is < {MAX_LINES}"


def test_every_table_names_the_command_that_makes_it() -> None:
    missing = [
        row
        for section in sections(DOCS.read_text().splitlines())
        for row in tables_without_command(section)
    ]
    assert missing == []


def test_a_table_below_a_command_in_another_section_is_caught() -> None:
    page = [
        "## A",
        "",
        "`python -m bench.a`:",
        "",
        "| x |",
        "|---|",
        "",
        "## B",
        "",
        "| y |",
        "|---|",
    ]
    found = [row for section in sections(page) for row in tables_without_command(section)]
    assert found == ["'## B': | y |"]
