"""How a mend says it could not, or must not, go ahead."""

from __future__ import annotations


class Unmendable(Exception):
    """The body needs a mend it cannot get: it is forwarded as it came, and the log says why."""


class Refused(Exception):
    """The request cannot be served as the client means it: a 400 in its API's shape, with this
    message (naming the field)."""
