"""The draft-control probe's verdict from the command line alone, without asking the backend (the
probe on real backends: tests/supervisor/test_draft_probe.py)."""

from __future__ import annotations

import aiohttp

from supervisor.draft_probe import probe_draft_control
from supervisor.flags import speculation_in

MTP = ("--spec-type", "draft-mtp", "--spec-draft-n-max", "3")


def test_speculation_is_read_from_the_command_line() -> None:
    assert speculation_in(["llama-server", "-m", "x", *MTP])
    assert speculation_in(["llama-server", "--spec-type=ngram-mod"])
    assert not speculation_in(["llama-server", "-m", "x"])
    assert not speculation_in(["llama-server", "--spec-type", "none"])
    assert not speculation_in(["llama-server", "--spec-type=none"])


async def test_no_speculation_on_the_command_line_is_none_without_asking() -> None:
    # The verdict comes from the spec alone: the backend is never asked (nothing listens there).
    async with aiohttp.ClientSession() as session:
        found = await probe_draft_control(
            session, "http://127.0.0.1:9", model="m", speculative=False, timeout_s=20.0
        )
    assert (found.control, found.failed) == ("none", False)
    assert "without speculation" in found.reason
