"""Raw HTTP/1.1 over a socket, for what clients libraries will not do: half-sent heads, broken
chunks, half-closes, idle connections."""

from __future__ import annotations

import json
import socket
import time
from typing import Any


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(timeout)
    return sock


def head(path: str, key: str | None, **headers: str | int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def request(
    path: str, body: bytes, key: str | None, *, close: bool = True, **headers: str | int
) -> bytes:
    if close:
        headers["Connection"] = "close"
    return head(path, key, Content_Length=len(body), **headers) + body


def chat_body(content: str = "hi", max_tokens: int = 4, **extra: Any) -> bytes:
    messages = [{"role": "user", "content": content}]
    return json.dumps(
        {"model": "mtp-demo", "messages": messages, "max_tokens": max_tokens, **extra}
    ).encode()


def read_until_closed(sock: socket.socket) -> tuple[bytes, float, bool]:
    """Everything until the server closes; (bytes, seconds taken, closed by the server)."""
    began = time.monotonic()
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data, time.monotonic() - began, False
    except ConnectionResetError:
        pass
    return data, time.monotonic() - began, True


def final_status(data: bytes) -> int | None:
    """Status of the final (non-1xx) response in the bytes, if any."""
    for line in data.split(b"\r\n"):
        if line.startswith(b"HTTP/1.1 ") and not line.startswith(b"HTTP/1.1 1"):
            return int(line.split()[1])
    return None


def json_body(data: bytes) -> Any:
    return json.loads(data.split(b"\r\n\r\n")[-1])
