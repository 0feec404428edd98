"""A minimal sd_notify(3) client: tells systemd (Type=notify) that the proxy is ready or stopping.

No dependency on libsystemd: the protocol is one datagram of newline-separated KEY=VALUE lines to
the unix socket named by $NOTIFY_SOCKET. Outside systemd the variable is unset and every call is a
cheap no-op, so callers never need to know how they were started.
"""

from __future__ import annotations

import os
import socket

import structlog

_log = structlog.get_logger("proxy.sdnotify")


def notify(message: str) -> bool:
    """Send `message` (e.g. "READY=1", "STOPPING=1") to systemd's notification socket.

    Returns True when the datagram was sent, False when $NOTIFY_SOCKET is unset or sending failed.
    Never raises and never blocks: a full or vanished socket costs one log line, not the proxy.
    """
    address = _address(os.environ.get("NOTIFY_SOCKET", ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.setblocking(False)
            sock.sendto(message.encode("utf-8"), address)
    except OSError as exc:
        _log.warning("sd_notify failed", message=message[:80], error=str(exc))
        return False
    return True


def _address(value: str) -> str | bytes | None:
    """The socket address $NOTIFY_SOCKET names, or None when there is none we can use.

    '@name' is Linux's abstract namespace (a leading NUL byte); like libsystemd, only absolute
    paths are accepted otherwise (a relative path would depend on the working directory).
    """
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode("utf-8")
    if value.startswith("/"):
        return value
    _log.warning("sd_notify: unsupported NOTIFY_SOCKET", notify_socket=value)
    return None
