"""`mtp-proxy learned export` on one box, `import` on another, on real proxies over the simulator:
the second proxy starts from the first one's estimates; another model file, or a bad file, is
refused with a message and the learned file is left as it was."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tests.support.cli import run_cli
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)
from tests.support.traffic import body_for, send

MODEL = "mtp-demo"


def config_of(workdir: Path, box: str, preset: str = "setup-b") -> dict[str, Any]:
    routing = {
        "clock_scale": 50.0,
        "seed": 1,
        "min_samples": 3,
        "learned_file": str(workdir / "learned.json"),
        "box_id": box,
    }
    model = simulator_model(preset=preset, time_scale=50.0)
    return proxy_config([model], routing=routing)


def write_config(workdir: Path, config: dict[str, Any]) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "cli.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def learned_rows(proxy: ProxyProcess) -> dict[tuple[str, str], float]:
    status, table = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
    assert status == 200
    return {
        (row["class"], row["profile"]): row["decode_tok_s"]
        for row in table["learned"]
        if row["decode_tok_s"] is not None
    }


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[Any, float]]]:
    """Box A: pinned requests to every profile, then stopped (it saves at exit)."""
    workdir = tmp_path_factory.mktemp("box-a")
    with running_proxy(config_of(workdir, "box-a"), workdir / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 3})
        for _ in range(4):
            for profile in ("off", "min", "max"):
                headers = {"X-MTP-Profile": profile}
                sent = send(proxy.url, "chat", body_for("chat", stream=True), headers=headers)
                assert sent.status == 200
        rows = learned_rows(proxy)
    assert len(rows) == 3 and (workdir / "learned.json").is_file()
    yield workdir, rows


def test_export_then_import_gives_the_second_box_the_first_ones_priors(
    first: tuple[Path, dict[Any, float]], tmp_path: Path
) -> None:
    workdir_a, rows_a = first
    export = tmp_path / "a-export.json"
    done = run_cli(
        "learned", "export", str(export), "--config", str(workdir_a / "proxy" / "config.toml")
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(export.read_text())
    assert document["keys"][MODEL]["box"] == "box-a" and len(document["cells"]) == 3
    assert all(len(row["decode"]) == 4 for row in document["cells"])  # sums, not ratios

    workdir_b = tmp_path / "box-b"
    config_b = config_of(workdir_b, "box-b")
    done = run_cli(
        "learned", "import", str(export), "--config", str(write_config(workdir_b, config_b))
    )
    assert done.returncode == 0, done.stderr
    assert "merged 1 export(s)" in done.stdout
    with running_proxy(config_b, workdir_b / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 3})
        status, table = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        assert status == 200 and "3 cells from priors" in table["state"]
        rows_b = learned_rows(proxy)
    assert rows_b.keys() == rows_a.keys()
    for where, speed in rows_a.items():
        assert rows_b[where] == pytest.approx(speed, rel=0.01)


def test_another_model_file_or_a_bad_file_is_refused_and_nothing_merged(
    first: tuple[Path, dict[Any, float]], tmp_path: Path
) -> None:
    workdir_a, _ = first
    export = tmp_path / "a-export.json"
    config_a = str(workdir_a / "proxy" / "config.toml")
    assert run_cli("learned", "export", str(export), "--config", config_a).returncode == 0
    # Box C runs another preset: its "model file" differs.
    workdir_c = tmp_path / "box-c"
    config_c = write_config(workdir_c, config_of(workdir_c, "box-c", preset="setup-a"))
    done = run_cli("learned", "import", str(export), "--config", str(config_c))
    assert done.returncode == 1
    assert "refused, nothing merged" in done.stderr and "model_hash differs" in done.stderr
    assert not (workdir_c / "learned.json").exists()
    # Box B: a good export and a truncated one in one import: neither is merged.
    workdir_b = tmp_path / "box-b"
    config_b = write_config(workdir_b, config_of(workdir_b, "box-b"))
    learned_b = workdir_b / "learned.json"
    learned_b.write_bytes(b'{"version":1,"cells":[]}')
    truncated = tmp_path / "truncated.json"
    truncated.write_bytes(export.read_bytes()[:-40])
    done = run_cli("learned", "import", str(export), str(truncated), "--config", str(config_b))
    assert done.returncode == 1 and f"{truncated}: not a whole export" in done.stderr
    assert learned_b.read_bytes() == b'{"version":1,"cells":[]}'


def test_a_learned_file_carried_to_another_box_starts_from_priors(
    first: tuple[Path, dict[Any, float]], tmp_path: Path
) -> None:
    workdir_a, _ = first
    workdir_d = tmp_path / "box-d"
    workdir_d.mkdir()
    (workdir_d / "learned.json").write_bytes((workdir_a / "learned.json").read_bytes())
    with running_proxy(config_of(workdir_d, "box-d"), workdir_d / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 3})
        status, table = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        assert status == 200
        assert f"learned_state_stale: {MODEL} (box changed)" in table["state"]
        assert learned_rows(proxy) == {}
        (line,) = [x for x in proxy.log_lines() if x.get("event") == "learned_state_stale"]
    assert line["changed"] == ["box"] and line["cells_dropped"] == 3


def test_two_builds_that_print_the_same_version_have_different_keys(tmp_path: Path) -> None:
    """A build from a tree without git prints "commit unknown" whatever it holds: the binary's
    hash tells two apart (proxy.plans.learned_keys)."""
    from proxy.plans.learned_keys import build_of

    builds = []
    for n in (1, 2):
        binary = tmp_path / f"build-{n}" / "llama-server"
        binary.parent.mkdir()
        binary.write_text(
            f"#!/bin/sh\n# build {n}\necho 'version: 0.6.0-dev (build 0, commit unknown)' >&2\n"
        )
        binary.chmod(0o755)
        builds.append(build_of(str(binary)))
    assert all(b.startswith("version: 0.6.0-dev (build 0, commit unknown) ; ") for b in builds)
    assert builds[0] != builds[1]
