"""A tiny real backend for the supervisor tests: serves /health like llama-server does.

`python tests/support/backend_child.py [flags] --host H --port P`. Standard library only, so it
starts in a few tens of milliseconds. /health answers 503 "Loading model" for --load-time seconds,
then 200 {"status":"ok"}; other paths 404. Faults on request: exit at once, exit later, ignore
SIGTERM, leave a grandchild in the process group.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def backend_argv(*flags: str) -> tuple[str, ...]:
    """The command that runs this program (the supervisor appends --host/--port)."""
    return (sys.executable, os.path.abspath(__file__), *flags)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--load-time", type=float, default=0.0)
    parser.add_argument("--exit-at-once", action="store_true")
    parser.add_argument("--exit-after", type=float, default=None)
    parser.add_argument("--exit-code", type=int, default=1)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--grandchild", action="store_true")
    args, unknown = parser.parse_known_args()

    print(f"backend_child starting pid={os.getpid()} extra={unknown}", flush=True)
    if args.exit_at_once:
        print("error: cannot load model: simulated failure", file=sys.stderr, flush=True)
        sys.exit(args.exit_code)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    else:
        # Exit cleanly (code 0) on SIGTERM, like llama-server does.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.grandchild:
        # Stays in our process group and ignores SIGTERM: only a group SIGKILL ends it.
        code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
        grandchild = subprocess.Popen([sys.executable, "-c", code])
        print(f"grandchild pid={grandchild.pid}", flush=True)

    ready_at = time.monotonic() + args.load_time
    server = ThreadingHTTPServer((args.host, args.port), _handler(ready_at))
    server.daemon_threads = True
    print(f"listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
    if args.exit_after is not None:
        threading.Timer(args.exit_after, _exit_now, (args.exit_code,)).start()
    try:
        server.serve_forever(poll_interval=0.05)
    finally:
        print("backend_child exiting", file=sys.stderr, flush=True)


def _handler(ready_at: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/health", "/v1/health"):
                self._send(404, {"error": {"message": "not found", "code": 404}})
            elif time.monotonic() < ready_at:
                error = {"message": "Loading model", "type": "unavailable_error", "code": 503}
                self._send(503, {"error": error})
            else:
                self._send(200, {"status": "ok"})

        def _send(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the health check timed out and left (SIGSTOP tests)

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep the output for the lines the tests look for

    return Handler


def _exit_now(code: int) -> None:
    print(f"exiting with code {code}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
