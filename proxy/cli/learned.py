"""``mtp-proxy learned export FILE`` and ``mtp-proxy learned import FILE...``: what one box
learned, as priors for others (proxy.routing.priors).

export: the learned file (``routing.learned_file``) as additive statistics, keyed by what it was
learned on. import: exports checked whole, merged, and written as the learned file's priors; a
running proxy takes them at its next reload (SIGHUP) or start, for the cells it has not learned
itself. Nothing is written when any file is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from proxy.cli.check_config import apply_service_environment, load_or_exit
from proxy.config.files import read_local_file
from proxy.config.settings import Settings
from proxy.plans.learned_keys import learned_keys
from proxy.routing.priors import (
    ExportRefused,
    LearnedKey,
    export_document,
    merge,
    read_export,
)
from proxy.routing.stats import LearnedStats, write_atomic

_MAX_EXPORT_BYTES = 256 << 20  # a box's export is kilobytes; a merge of 1,000 a few MB


def add_parser(commands: Any) -> None:
    learned = commands.add_parser(
        "learned",
        help="export what this box learned, or import other boxes' exports as priors",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = learned.add_subparsers(dest="action", required=True)
    export = actions.add_parser("export", help="write the learned file as an export")
    export.add_argument("file", type=Path, help="the export to write")
    imported = actions.add_parser("import", help="merge exports into this box's priors")
    imported.add_argument("files", type=Path, nargs="+", help="exports of other boxes")
    for action in (export, imported):
        action.add_argument("--config", type=Path, help="the TOML file (routing.learned_file)")


def run(args: argparse.Namespace) -> int:
    if args.config is not None:
        apply_service_environment(args.config)
    settings = load_or_exit(args.config)
    path = settings.routing.learned_file
    if path is None:
        print(
            "mtp-proxy learned: routing.learned_file is not set: nothing learned is kept",
            file=sys.stderr,
        )
        return 2
    if args.action == "export":
        return _export(settings, path, args.file)
    return _import(settings, path, args.files)


def _export(settings: Settings, path: Path, target: Path) -> int:
    stats = LearnedStats.load(path, settings.routing)
    current = learned_keys(settings)
    # The keys the cells were learned on, as the learned file says (this box's for a file
    # written before keys were kept).
    keys = {
        model: LearnedKey.from_json(stats.keys[model]) if model in stats.keys else key
        for model, key in current.items()
    }
    document = export_document(stats, keys)
    write_atomic(target, json.dumps(document, separators=(",", ":")).encode())
    print(f"exported {len(document['cells'])} cells of {path} to {target}")
    return 0


def _import(settings: Settings, path: Path, files: list[Path]) -> int:
    keys = learned_keys(settings)
    base = _learned_document(path, settings)
    if base is None:
        return 1
    try:
        documents = [
            (str(f), read_export(read_local_file(f, _MAX_EXPORT_BYTES), str(f))) for f in files
        ]
        if base["priors"]:  # what earlier imports merged: the new exports add to it
            earlier = read_export(json.dumps(base["priors"]).encode(), f"{path} (its priors)")
            documents.insert(0, (str(path), earlier))
        merged = merge(documents, keys)
    except (ExportRefused, OSError) as exc:
        print(f"mtp-proxy learned import: refused, nothing merged: {exc}", file=sys.stderr)
        return 1
    base["priors"] = merged
    write_atomic(path, json.dumps(base, separators=(",", ":")).encode())
    print(
        f"merged {len(files)} export(s) into the priors of {path}: {len(merged['cells'])} "
        f"cells from {merged['boxes']} box(es); a running proxy takes them at its next reload "
        "(SIGHUP) or start"
    )
    return 0


def _learned_document(path: Path, settings: Settings) -> dict[str, Any] | None:
    """The learned file as JSON to add priors to (a new one when there is none); None, said
    why, when it exists but is not a learned file: it is not written over."""
    try:
        document = json.loads(read_local_file(path, _MAX_EXPORT_BYTES))
    except FileNotFoundError:
        document = json.loads(LearnedStats(settings.routing).dumps())
    except (OSError, ValueError) as exc:
        print(
            f"mtp-proxy learned import: {path} is not readable ({exc}); nothing merged",
            file=sys.stderr,
        )
        return None
    if not isinstance(document, dict) or document.get("version") != 1:
        print(
            f"mtp-proxy learned import: {path} is not a learned file; nothing merged",
            file=sys.stderr,
        )
        return None
    priors = document.get("priors") or {}
    document["priors"] = priors if isinstance(priors, dict) else {}
    return document
