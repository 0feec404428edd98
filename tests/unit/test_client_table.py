"""bench/client_table.py: one row per client run, one column per target, exit code and statuses."""

from __future__ import annotations

from bench.client_table import table

QWEN = "llama-server-Qwen3.5-4B"
GEMMA = "llama-server-google-gemma-4-31B-it"


def run(test: str, target: str, exit_code: int, *statuses: int) -> dict[str, object]:
    return {
        "test": f"tests/clients/test_clients.py::{test}",
        "target": target,
        "exit": exit_code,
        "requests": [["POST", "/v1/messages", s] for s in statuses],
    }


def test_rows_are_clients_and_columns_targets() -> None:
    runs = [
        run(f"test_claude_code_print_mode[{QWEN}]", QWEN, 1, 500, 500, 200),
        run(f"test_claude_code_print_mode[{GEMMA}]", GEMMA, 0, 200),
        run(f"test_opencode_run[{QWEN}-anthropic]", QWEN, 0, 200, 200),
        run("test_opencode_run[simulator-anthropic]", "simulator", 0),
    ]
    assert table(runs).splitlines() == [
        f"| client run | {QWEN} | {GEMMA} | simulator |",
        "|---|---|---|---|",
        "| claude_code_print_mode | exit 1, 1 x 200, 2 x 500 | exit 0, 1 x 200 | - |",
        "| opencode_run[anthropic] | exit 0, 2 x 200 | - | exit 0, no request |",
    ]
