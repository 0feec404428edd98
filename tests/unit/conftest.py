"""tests/unit is the fast lane: every test here fails if it opens a network socket or starts a
process (tests/support/unit_guard.py), in its setup, its call or its teardown."""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.support.unit_guard import no_network_no_processes


def _guarded(item: pytest.Item) -> Generator[None, object, object]:
    with no_network_no_processes() as refused:
        result = yield
    if refused:
        pytest.fail(
            f"{item.nodeid} is in tests/unit but did {', '.join(refused)}; "
            "a test that needs a socket or a process belongs in the package's folder",
            pytrace=False,
        )
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    if nextitem is None:
        # The session ends here: this teardown also closes every wider-scoped fixture of the
        # run, other folders' included, which may well stop processes of their own.
        return (yield)
    return (yield from _guarded(item))
