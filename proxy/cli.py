"""`mtp-proxy` command line: serve, check-config, status, tune."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import structlog

from proxy.config.settings import ConfigError, ModelSettings, Settings, load_settings
from proxy.plans.plan import (
    ModelPlan,
    backend_specs,
    backend_specs_of,
    describe_plan,
    initial_plan,
    plans_of,
)
from proxy.plans.preflight import log_result, pool_fits, render, run_preflight
from supervisor.commandline import LlamaServerNotFoundError
from supervisor.spec import BackendSpec


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command: str = args.command
    if command == "check-config":
        return _check_config(Path(args.path))
    if command == "status":
        from proxy.ops.status import print_status

        status: int = print_status(args.url, args.admin_key, args.watch)
        return status
    if command == "tune":
        from proxy.tune.command import run as tune

        return tune(args)
    return _serve(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtp-proxy", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the proxy and its backends")
    serve.add_argument(
        "--config", type=Path, help="TOML file (default: the embedded demo configuration)"
    )
    serve.add_argument("--host", help="listen address (default from config: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default from config: 8080)")
    check = commands.add_parser("check-config", help="validate a config file and summarise it")
    check.add_argument("path")
    status = commands.add_parser("status", help="show backends and the learned routing table")
    status.add_argument("--url", default="http://127.0.0.1:8080")
    status.add_argument("--admin-key", default=None, help="or set MTP_PROXY_ADMIN_KEY")
    from proxy.ops.status import watch_seconds

    status.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=watch_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C",
    )
    from proxy.tune.command import add_parser as add_tune

    add_tune(commands)
    return parser


def _load_or_exit(path: Path | None) -> Settings:
    try:
        return load_settings(path)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        raise SystemExit(2) from None


def _backends_or_exit(
    settings: Settings, source: str, plans: dict[str, ModelPlan] | None = None
) -> list[BackendSpec]:
    """Every backend's command line; exit 2 listing every profile that has none (a missing
    or non-executable binary, a flag the supervisor owns), as for an invalid file."""
    problems = []
    for m, model in enumerate(settings.models):
        for p, profile in enumerate(model.profiles):
            try:
                backend_specs_of(model, profile)
            except (LlamaServerNotFoundError, OSError, ValueError) as exc:
                problems.append(f"models.{m}.profiles.{p} ({model.name}/{profile.name}): {exc}")
    if problems:
        print(ConfigError(source, problems).render(), file=sys.stderr)
        raise SystemExit(2)
    return backend_specs(settings, plans)


def _check_config(path: Path) -> int:
    settings = _load_or_exit(path)
    plans = plans_of(settings)
    specs = _backends_or_exit(settings, str(path), plans)
    print(f"{path}: OK")
    print(f"listen: {settings.server.host}:{settings.server.port}")
    for model in settings.models:
        aliases = f" (aliases: {', '.join(model.aliases)})" if model.aliases else ""
        print(f"model {model.name}{aliases}: {len(model.profiles)} profile(s)")
        print("\n".join(f"  {line}" for line in describe_plan(model, plans[model.name])))
        if not plans[model.name].decided:
            print(f"  {_fallback_memory(model)}")
        for spec in (s for s in specs if s.model == model.name):
            target = spec.url or " ".join([*spec.argv, "--host", "127.0.0.1", "--port", "<free>"])
            print(f"  {spec.name}: {target}")
    names = settings.model_names
    for pattern, target_model in names.patterns.items():
        print(f"model names matching {pattern!r}: {target_model}")
    print(f"any other model name: {names.default or 'refused (404)'}")
    memory = run_preflight(settings, plans=plans)
    print("\n".join(render(memory)))
    for warning in memory.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _fallback_memory(model: ModelSettings) -> str:
    """What auto's fallback would need: the pool's memory against what is free."""
    fits, note = pool_fits(model, initial_plan(model))
    verdict = {True: "fits", False: "does not fit", None: "fit unknown"}[fits]
    return f"the pool {verdict}: {note}"


def _serve(args: argparse.Namespace) -> int:
    from proxy.app import serve
    from proxy.ops.logs import configure_logging
    from proxy.serving.connections import ListenError

    settings = _load_or_exit(args.config)
    _backends_or_exit(settings, str(args.config or "<embedded default>"))
    if args.host is not None:
        settings.server.host = args.host
    if args.port is not None:
        settings.server.port = args.port
    configure_logging(settings.log.level, settings.log.format, secrets=_secrets(settings))
    # Before the event loop: the check may wait for nvidia-smi.
    log_result(run_preflight(settings), structlog.get_logger("proxy.preflight"))
    try:
        _run(serve(settings, config_path=args.config))
    except ListenError as exc:
        print(f"mtp-proxy: {exc}", file=sys.stderr)
        return 2
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
