"""A throwaway Linux box for running deploy/systemd/install.sh for real: a mount and PID
namespace in which /etc, /opt, /var, /srv, /root and /home are overlays (reads see the host,
writes land in the test's folder and vanish with it), with a stand-in systemctl and journalctl
first on PATH (tests/support/fake_systemd: no systemd runs here). useradd, runuser, pip and the
build script are the real ones. Needs root (namespaces, overlay mounts); every process in the
box dies with it (its PID namespace).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

OVERLAID = ("/etc", "/opt", "/var", "/srv", "/root", "/home")
STUBS = Path(__file__).resolve().parent / "fake_systemd"
PATH = f"{STUBS}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxError(RuntimeError):
    pass


class Sandbox:
    def __init__(self, workdir: Path) -> None:
        for tool in ("unshare", "nsenter", "mount", "setpriv", "runuser", "useradd"):
            if shutil.which(tool) is None:
                raise SandboxError(f"{tool} is needed for the install sandbox (util-linux)")
        if os.geteuid() != 0:
            raise SandboxError("the install sandbox needs root (mount namespaces, overlays)")
        self.workdir = workdir
        mounts = []
        for target in OVERLAID:
            layer = workdir / "layers" / target.strip("/")
            (layer / "upper").mkdir(parents=True)
            (layer / "work").mkdir()
            # The overlay's top folder takes the upper layer's mode: /root stays 0700.
            seen = os.stat(target)
            os.chmod(layer / "upper", seen.st_mode & 0o7777)
            os.chown(layer / "upper", seen.st_uid, seen.st_gid)
            mounts.append(
                f"mount -t overlay overlay -o lowerdir={target},upperdir={layer}/upper,"
                f"workdir={layer}/work {target}"
            )
        ready = workdir / "ready"
        script = " && ".join([*mounts, f"touch {ready}", "exec sleep infinity"])
        self._holder = subprocess.Popen(
            ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
             "--propagation", "private", "--", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self._holder.poll() is not None or time.monotonic() > deadline:
                output = self._holder.communicate()[0] if self._holder.poll() is not None else b""
                self.close()
                raise SandboxError(f"the sandbox did not start: {output.decode(errors='replace')}")
            time.sleep(0.05)
        # unshare --fork: the box's PID 1 (sleep) is the holder's child.
        children = Path(f"/proc/{self._holder.pid}/task/{self._holder.pid}/children")
        self.pid = int(children.read_text().split()[0])

    def run(
        self, command: str, *, timeout: float = 600, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`bash -c command` inside the box, as root, with the stubs first on PATH."""
        environ = {
            "PATH": PATH,
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            **{k: v for k, v in os.environ.items() if k.startswith(("PIP_", "XDG_CACHE"))},
            **(env or {}),
        }
        return subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", "--", "env", "-i",
             *[f"{k}={v}" for k, v in environ.items()], "bash", "-c", command],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def close(self) -> None:
        """Everything in the box ends with its PID 1; the overlays go with its mounts."""
        if self._holder.poll() is None:
            self._holder.kill()
        self._holder.wait()
