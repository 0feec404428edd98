"""Reading the local files a user names (a config, a trace, tune's results, the learned file)
as bounded reads that refuse what is not a regular file.

A FIFO at the path would block the reader for ever, `/dev/zero` or another device never ends
(a read of it fills memory), and a file far larger than its kind ever is is not one: each is
refused at once with an OSError that says which. Deep nesting is the parsers' business: their
RecursionError is caught where the file is parsed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CONFIG_LIMIT = 1 << 20  # a config is kilobytes
TRACE_LIMIT = 1 << 30  # a trace of many 100k-token requests is hundreds of megabytes
RESULTS_LIMIT = 256 << 20  # tune's results: a line per measured request


class NotAFileError(OSError):
    """The path names something that is not a regular file of a sensible size."""


def read_local_file(path: Path, limit: int) -> bytes:
    """The file's bytes; NotAFileError for anything but a regular file of at most `limit`
    bytes (FileNotFoundError and the other OSErrors as they come)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, and is refused
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFileError(f"{path} is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise NotAFileError(f"{path} is larger than {limit} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:  # it grew while read
            raise NotAFileError(f"{path} is larger than {limit} bytes")
        return data
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
