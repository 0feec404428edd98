"""`mtp-proxy` command line: serve, check-config, status, init, tune, learned."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import structlog
from pydantic import SecretStr

from proxy.cli.check_config import (
    apply_service_environment,
    backends_or_exit,
    check_config,
    load_or_exit,
)
from proxy.config.settings import Settings

_SIGPIPE_STATUS = 141  # 128 + SIGPIPE: what `cat` and friends report when the reader left


def main(argv: list[str] | None = None) -> int:
    try:
        status = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError:
        # The reader went away (`mtp-proxy check-config | head`): nothing more to say, and no
        # traceback. Later writes (the interpreter flushing at exit) go nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return _SIGPIPE_STATUS
    return status


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    command: str = args.command
    if command == "check-config":
        path = args.config or args.path
        if path is None:
            print("mtp-proxy check-config: name the file: --config FILE", file=sys.stderr)
            return 2
        return check_config(path, args.unit)
    if command == "status":
        return _status(args)
    if command == "init":
        from proxy.cli.init_config import run as init

        return init(args)
    if command in ("tune", "learned"):
        return _offline(command, args)
    return _serve(args)


def _offline(command: str, args: argparse.Namespace) -> int:
    """The commands that work beside the service (imported only when run)."""
    if command == "tune":
        from proxy.tune.command import run as tune

        return tune(args)
    from proxy.cli.learned import run as learned

    return learned(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtp-proxy", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mtp-proxy {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the proxy and its backends",
        description="Run the proxy and its backends. Without --config: the embedded demo, one "
        "simulated llama-server (no GPU) serving the profiles off/min/max as per-request depths.",
    )
    serve.add_argument(
        "--config", type=Path, help="TOML file (default: the embedded demo configuration)"
    )
    serve.add_argument("--host", help="listen address (default from config: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default from config: 8080)")
    check = commands.add_parser(
        "check-config",
        help="validate a config file and summarise it",
        description="Validate a config file as the service will run it and summarise it; exit "
        "status 2 lists every problem.",
    )
    check.add_argument("--config", type=Path, help="the TOML file to check")
    check.add_argument("path", nargs="?", type=Path, help="the same, as a positional argument")
    check.add_argument(
        "--unit",
        type=Path,
        help="the systemd unit whose Environment= applies (default: the installed "
        "/etc/systemd/system/mtp-proxy.service when it runs this file)",
    )
    status = commands.add_parser("status", help="show backends and the learned routing table")
    status.add_argument(
        "--config", type=Path, help="read the URL and the admin key from this config file"
    )
    status.add_argument("--url", help="the proxy's URL (default: http://127.0.0.1:8080)")
    status.add_argument("--admin-key", default=None, help="or set MTP_PROXY_ADMIN_KEY")
    from proxy.cli.status import watch_seconds

    status.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=watch_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C",
    )
    from proxy.cli.init_config import add_parser as add_init
    from proxy.cli.learned import add_parser as add_learned
    from proxy.tune.command import add_parser as add_tune

    add_init(commands)
    add_tune(commands)
    add_learned(commands)
    return parser


def _version() -> str:
    try:
        return version("mtp-proxy")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _status(args: argparse.Namespace) -> int:
    from proxy.cli.status import print_status

    url, key = args.url, args.admin_key
    if args.config is not None:
        apply_service_environment(args.config)  # the port the service listens on, say
        settings = load_or_exit(args.config)
        host = settings.server.host
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104 - a wildcard
        url = url or f"http://{host}:{settings.server.port}"
        admin = settings.server.admin_key
        key = key or (admin.get_secret_value() if admin is not None else None)
    status: int = print_status(url or "http://127.0.0.1:8080", key, args.watch)
    return status


def _serve(args: argparse.Namespace) -> int:
    from proxy.app import serve
    from proxy.cli.banner import render_banner
    from proxy.lifecycle.fail_fast import EXIT_STATUS, ModelCannotStartError
    from proxy.observability.logs import configure_logging
    from proxy.plans.model_files import gguf_problems
    from proxy.plans.preflight import log_result, run_preflight
    from proxy.serving.connections import ListenError

    settings = load_or_exit(args.config)
    # A model file that is no GGUF (or a truncated one) is refused before anything starts.
    source = str(args.config or "<embedded default>")
    backends_or_exit(settings, source, problems=gguf_problems(settings))
    if args.host is not None:
        settings.server.host = args.host
    if args.port is not None:
        settings.server.port = args.port
    made_up_key = _demo_admin_key(settings, args.config)
    configure_logging(settings.log.level, settings.log.format, secrets=_secrets(settings))
    # Before the event loop: the check may wait for nvidia-smi.
    log_result(run_preflight(settings), structlog.get_logger("proxy.preflight"))

    def on_listening(port: int) -> None:
        if sys.stdout.isatty():
            text = render_banner(
                settings,
                port,
                version=_version(),
                config_path=args.config,
                command=_own_command(),
                admin_key=made_up_key,
            )
            print(text, flush=True)

    try:
        _run(serve(settings, config_path=args.config, on_listening=on_listening))
    except ListenError as exc:
        print(f"mtp-proxy: {exc}", file=sys.stderr)
        return 2
    except ModelCannotStartError as exc:
        print(f"mtp-proxy: {exc}", file=sys.stderr)
        return EXIT_STATUS
    return 0


def _demo_admin_key(settings: Settings, config: Path | None) -> str | None:
    """The demo (no --config) has no admin key of its own: make one up for this run, so that
    `mtp-proxy status` works against it (the banner shows it)."""
    if config is not None or settings.server.admin_key is not None:
        return None
    key = secrets.token_hex(16)  # hex: never a leading "-", which a command line reads as a flag
    settings.server.admin_key = SecretStr(key)
    return key


def _own_command() -> str:
    """How the user ran this program: the path they typed (.venv/bin/mtp-proxy), or the name."""
    typed = sys.argv[0]
    if Path(typed).name == "mtp-proxy":
        return typed
    return "mtp-proxy"


def _secrets(settings: Settings) -> list[str]:
    """The configured keys: the log redacts them wherever they would appear."""
    server = settings.server
    keys = [*server.api_keys, *([server.admin_key] if server.admin_key else [])]
    return [key.get_secret_value() for key in keys]


def _run(main_coroutine: object) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        asyncio.run(main_coroutine)  # type: ignore[arg-type]
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main_coroutine)  # type: ignore[arg-type]
