"""A real drumsd for the tests: started on a state directory of its own, with a
bridge, subnet and cgroup parent named after this process, and stopped at the
end with proof that it left nothing on the host (the Rust tests' TestDaemon,
crates/daemon/tests/common/mod.rs, in Python)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGES_DIR = Path("/var/lib/drums/images")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SESSION_IDS = re.compile(r"\bsessions?=\"?([0-9a-f]{12}(?:,[0-9a-f]{12})*)")


def bin_dir() -> Path:
    """Where drumsd, drums, drums-init and drums-guest are (`DRUMS_BIN_DIR`,
    default the repo's target/release)."""
    return Path(os.environ.get("DRUMS_BIN_DIR") or REPO / "target/release")


def preconditions() -> str | None:
    """Why these tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "the tests run a real drumsd, which needs root (namespaces, mounts, cgroups)"
    if not (IMAGES_DIR / "default/image.json").exists():
        return f"no default image in {IMAGES_DIR}: run scripts/setup.sh"
    for b in ("drumsd", "drums", "drums-init", "drums-guest"):
        if not (bin_dir() / b).exists():
            return f"{bin_dir() / b} missing: build the workspace (or set DRUMS_BIN_DIR)"
    return None


class Daemon:
    """One drumsd. `k` picks its names: bridge drpy<k>, subnet 10.216.<k>.0/24,
    cgroup parent drums-py-<k>."""

    def __init__(
        self,
        k: int,
        state: Path | None = None,
        *,
        llm_proxy_local: str = "off",
        extra_args: tuple[str, ...] = (),
        store_gib: int = 4,
    ) -> None:
        self.k = k
        # The LLM proxy's host listener defaults to 127.0.0.1:7080, which a
        # second daemon (the crash test's, another engineer's) would fight
        # over: off unless a test (the integrations') serves it a port.
        self.llm_proxy_local = llm_proxy_local
        self.extra_args = extra_args
        self.store_gib = store_gib
        self.state = state or Path(tempfile.mkdtemp(prefix=f"drumspy{k}-"))
        self.socket = self.state / "drumsd.sock"
        self.log_path = self.state / "drumsd.log"
        self.bridge = f"drpy{k}"
        self.subnet = f"10.216.{k}.0/24"
        self.cgroup_parent = f"drums-py-{k}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.images_before: set[str] = set()

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(bin_dir() / "drumsd"),
                    "--state-dir", str(self.state),
                    "--images-dir", str(IMAGES_DIR),
                    "--bin-dir", str(bin_dir()),
                    "--bridge", self.bridge,
                    "--subnet", self.subnet,
                    "--cgroup-parent", self.cgroup_parent,
                    "--store-gib", str(self.store_gib),
                    "--enable-fault-injection",
                    "--llm-proxy-local", self.llm_proxy_local,
                    *self.extra_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, "NO_COLOR": "1"},
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
                s.connect(str(self.socket))
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"drumsd exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        self.kill9()
        raise RuntimeError(f"drumsd did not come up in 60 s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        """SIGTERM, and wait: drumsd removes every session and its own resources."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise RuntimeError(
                f"drumsd did not stop within 60 s of SIGTERM:\n{self.log()}"
            ) from None
        self.proc = None
        if code != 0:
            raise RuntimeError(f"drumsd exited with {code}:\n{self.log()}")

    def stop_and_check(self) -> None:
        """Stop, then prove nothing of this daemon is left (after a bounded
        wait: a killed process and a detaching loop device take a moment)."""
        self.stop()
        deadline = time.monotonic() + 10
        leaks = self.leaks()
        while leaks and time.monotonic() < deadline:
            time.sleep(0.1)
            leaks = self.leaks()
        if leaks:
            raise AssertionError(
                "drumsd left host resources behind:\n  "
                + "\n  ".join(leaks)
                + f"\n--- drumsd log ({self.log_path}) ---\n{self.log()[-5000:]}"
            )
        # Its state directory (the store image went with the daemon), and the
        # binaries drumsd installs beside it (STATE-bin), as the Rust tests'
        # TestDaemon removes them.
        shutil.rmtree(self.state, ignore_errors=True)
        shutil.rmtree(self.state.with_name(self.state.name + "-bin"), ignore_errors=True)

    def session_ids(self) -> set[str]:
        """Every session the log names: their veths are `drums<id[:10]>`."""
        found = _SESSION_IDS.findall(_ANSI.sub("", self.log()))
        return {sid for ids in found for sid in ids.split(",")}

    def leaks(self) -> list[str]:
        out: list[str] = []
        state = str(self.state)
        for pid in _pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                cg = Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"drumsd") and state.encode() in cmd:
                out.append(f"process: drumsd {pid}")
            if f"/{self.cgroup_parent}/" in cg and not _zombie(pid):
                out.append(f"process: {pid} in {self.cgroup_parent}")
        for line in Path("/proc/mounts").read_text().splitlines():
            if state in line:
                out.append(f"mount: {line}")
        net = Path("/sys/class/net")
        if (net / self.bridge).exists():
            out.append(f"link: bridge {self.bridge}")
        for sid in self.session_ids():
            if (net / f"drums{sid[:10]}").exists():
                out.append(f"link: veth drums{sid[:10]} of session {sid}")
        for h in Path("/sys/fs/cgroup").iterdir():
            if (h / self.cgroup_parent).exists():
                out.append(f"cgroup: {h / self.cgroup_parent}")
        for dev in Path("/sys/block").iterdir():
            try:
                backing = (dev / "loop/backing_file").read_text().strip()
            except OSError:
                continue
            if backing.startswith(state):
                out.append(f"loop device: {dev.name} -> {backing}")
        nft = shutil.which("nft")
        if nft:
            tables = subprocess.run([nft, "list", "tables"], capture_output=True, text=True)
            if f"drums-{self.bridge}" in tables.stdout.split():
                out.append(f"nft table: drums-{self.bridge}")
        return out

    def veths(self) -> list[str]:
        """Veths on its bridge now."""
        try:
            return sorted(os.listdir(f"/sys/class/net/{self.bridge}/brif"))
        except OSError:
            return []


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].startswith("Z")


def pick_k(offset: int = 0) -> int:
    """A number for this run's names, from the pid (1..249)."""
    return (os.getpid() + offset) % 249 + 1
