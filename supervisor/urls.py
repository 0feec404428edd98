"""A remote backend's base URL: what makes one usable, and how one is shown.

A base URL is the scheme, the host and port, and perhaps a path: the supervisor and the proxy
append theirs to it (/health, /v1/chat/completions). A query or a fragment would end up in the
middle of every such path (``/?token=X/health``): the backend never looked ready, and nothing
said why. Credentials belong in the userinfo (``http://user:password@host``), which aiohttp
sends as Basic authentication; wherever a URL is shown (logs, check-config, the admin routes,
status, the banner) its password is masked: ``http://user:***@host``.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

MASK = "***"
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/\s@:?#]*)(:[^/\s@?#]*)?@")


def shown(text: str) -> str:
    """``text`` with the userinfo of every URL in it masked: the password after ``user:``,
    or a user name alone (which may be a token) whole."""
    return _USERINFO.sub(_masked, text) if "@" in text else text


def _masked(match: re.Match[str]) -> str:
    scheme, user, password = match.groups()
    return f"{scheme}{user}:{MASK}@" if password is not None else f"{scheme}{MASK}@"


def base_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a backend's base URL (None: it can). The problem names the part,
    never its value: a query often carries a token."""
    if not url.startswith(("http://", "https://")):
        return "url must start with http:// or https://"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:
        return f"url is not a valid URL ({exc})"
    if not parts.hostname:
        return "url names no host"
    if "?" in url:
        where = "a query (?...)"
    elif "#" in url:
        where = "a fragment (#...)"
    else:
        return None
    return (
        f"url must be a base URL, without {where}: the proxy appends paths to it (/health, "
        "/v1/...), which would land after it and reach nothing. Put credentials in the "
        "userinfo (http://user:password@host, sent as Basic authentication)"
    )
