"""A Ray cluster of several nodes on this one host, each node with its own
drumsd: what `python -m drums.ray.demo`, the tests and the bench run on
(docs/cluster.md, "On one host").

Each node is a `ray start` (the first `--head`) with its own ports, a custom
resource naming it (`drums_node_<name>: 1`) and, in its environment, the
socket of its own drumsd (`DRUMS_SOCKET`), which the node's actor and
workers inherit. Each drumsd has its own state directory, store, bridge,
subnet and cgroup parent. Ray's addresses are loopback ones.

`stop()` stops every Ray process of the cluster and every drumsd, and proves
that nothing is left: no Ray process of the cluster, and no process, mount,
link, cgroup, loop device or nft table of any drumsd. Needs root, drums'
binaries (`DRUMS_BIN_DIR`, else beside `drumsd` on PATH) and the default
image (`/var/lib/drums/images`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

IMAGES_DIR = Path("/var/lib/drums/images")
# The environment variable every Ray process of a cluster carries (its temp
# dir): Ray's agents rewrite their command line, their environment stays.
CLUSTER_MARK = "DRUMS_RAY_CLUSTER"


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Standard output goes to standard error inside: Ray prints its nodes'
    events (a raylet killed) on standard output, where a `--json` caller
    wants its one object alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


class Drumsd(Protocol):
    """What the cluster needs of a node's drumsd launcher."""

    socket: Path
    state: Path
    cgroup_parent: str

    def start(self) -> None: ...
    def stop_and_check(self) -> None: ...
    def kill9(self) -> None: ...


DaemonFactory = Callable[..., Drumsd]


def bin_dir() -> Path:
    """Where drumsd and its binaries are: `DRUMS_BIN_DIR`, else drumsd's
    directory on PATH."""
    env = os.environ.get("DRUMS_BIN_DIR")
    if env:
        return Path(env)
    found = shutil.which("drumsd")
    if found is None:
        raise RuntimeError("no drumsd: set DRUMS_BIN_DIR or put drums' binaries on PATH")
    return Path(found).resolve().parent


class LocalDrumsd:
    """One drumsd of the cluster, on a state directory of its own; `k` picks
    its names: bridge drray<k>, subnet 10.214.<k>.0/24, cgroup parent
    drums-ray-<k>."""

    def __init__(
        self,
        k: int,
        *,
        store_gib: int = 4,
        extra_args: tuple[str, ...] = (),
        llm_proxy_local: str = "off",
    ) -> None:
        self.k = k
        self.state = Path(tempfile.mkdtemp(prefix=f"drums-ray{k}-"))
        # drumsd's state directory must be reachable by sessions' users.
        os.chmod(self.state, 0o755)
        self.socket = self.state / "drumsd.sock"
        self.log_path = self.state / "drumsd.log"
        self.bridge = f"drray{k}"
        self.cgroup_parent = f"drums-ray-{k}"
        self.args = [
            "--state-dir", str(self.state),
            "--images-dir", str(IMAGES_DIR),
            "--bin-dir", str(bin_dir()),
            "--bridge", self.bridge,
            "--subnet", f"10.214.{k}.0/24",
            "--cgroup-parent", self.cgroup_parent,
            "--store-gib", str(store_gib),
            "--llm-proxy-local", llm_proxy_local,
            *extra_args,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(bin_dir() / "drumsd"), *self.args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, "NO_COLOR": "1"},
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
                s.connect(str(self.socket))
                return
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"drumsd exited with {self.proc.returncode}: see {self.log_path}"
                )
            time.sleep(0.02)
        self.kill9()
        raise RuntimeError(f"drumsd did not come up in 60 s: see {self.log_path}")

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop_and_check(self) -> None:
        """SIGTERM (drumsd removes every session and what it made), then
        proof that nothing of it is left; its state directory goes."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill9()
                raise RuntimeError(
                    f"drumsd did not stop within 60 s: see {self.log_path}"
                ) from None
            self.proc = None
            if code != 0:
                raise RuntimeError(f"drumsd exited with {code}: see {self.log_path}")
        deadline = time.monotonic() + 10
        left = self.leaks()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.leaks()
        if left:
            raise RuntimeError(f"drumsd left host resources: {left} (log: {self.log_path})")
        shutil.rmtree(self.state, ignore_errors=True)
        shutil.rmtree(self.state.with_name(self.state.name + "-bin"), ignore_errors=True)

    def leaks(self) -> list[str]:
        out: list[str] = []
        state = str(self.state)
        for pid in _pids_with(state):
            out.append(f"process {pid}")
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                with contextlib.suppress(OSError):
                    if f"/{self.cgroup_parent}/" in (p / "cgroup").read_text():
                        out.append(f"process {p.name} in {self.cgroup_parent}")
        for line in Path("/proc/mounts").read_text().splitlines():
            if state in line:
                out.append(f"mount {line.split()[1]}")
        if Path(f"/sys/class/net/{self.bridge}").exists():
            out.append(f"bridge {self.bridge}")
        for h in Path("/sys/fs/cgroup").iterdir():
            if (h / self.cgroup_parent).exists():
                out.append(f"cgroup {h / self.cgroup_parent}")
        for dev in Path("/sys/block").iterdir():
            with contextlib.suppress(OSError):
                if (dev / "loop/backing_file").read_text().startswith(state):
                    out.append(f"loop device {dev.name}")
        nft = shutil.which("nft")
        if nft:
            tables = subprocess.run([nft, "list", "tables"], capture_output=True, text=True)
            if f"drums-{self.bridge}" in tables.stdout.split():
                out.append(f"nft table drums-{self.bridge}")
        return out


_PY_BIN = Path(sys.executable).parent
# Every node and the driver on a loopback address. Not 127.0.0.1: Ray turns
# "127.0.0.1" (and "localhost") into the host's own address, for nodes on
# other hosts to reach; the rest of 127.0.0.0/8 it takes as given.
LOOPBACK = "127.0.0.2"


def ray_bin() -> Path:
    """The `ray` of this Python's venv."""
    return _PY_BIN / "ray"


@dataclass
class RayNode:
    """One Ray node and its drumsd."""

    name: str
    daemon: Drumsd
    node_manager_port: int
    object_manager_port: int
    min_worker_port: int
    max_worker_port: int
    node_id: str = ""
    # Its drumsd was SIGKILLed (kill_node): stop() starts it again on its
    # state directory, whose sweep removes what the kill left, then stops it.
    killed: bool = False

    @property
    def resource(self) -> str:
        return f"drums_node_{self.name}"

    def raylet_pids(self) -> list[int]:
        """The node's raylet (found by its node manager port)."""
        return _pids_with(f"--node_manager_port={self.node_manager_port}")


def _pids_with(needle: str, what: str = "cmdline") -> list[int]:
    """The processes whose command line (or `environ`) holds `needle`."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            text = (p / what).read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if needle.encode() in text:
            out.append(int(p.name))
    return out


def _pids_holding(prefix: str) -> list[int]:
    """The processes with a file under `prefix` open."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fds = list((p / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd).startswith(prefix):
                    out.append(int(p.name))
                    break
            except OSError:
                continue
    return out


class LocalCluster:
    """N Ray nodes on this host, `a`, `b`, `c`..., each with its drumsd.

    `daemon` makes each node's drumsd launcher (default `LocalDrumsd`); the
    tests give theirs, which also checks the daemon's log."""

    def __init__(
        self,
        names: tuple[str, ...] = ("a", "b", "c"),
        *,
        k0: int,
        object_store_bytes: int = 400 << 20,
        store_gib: dict[str, int] | None = None,
        daemon_args: dict[str, tuple[str, ...]] | None = None,
        llm_upstream: str | None = None,
        daemon: DaemonFactory | None = None,
    ) -> None:
        make = daemon or LocalDrumsd
        self.temp_dir = Path(tempfile.mkdtemp(prefix="drums-ray-"))
        # Ports from the pid, apart from a developer's default cluster (6379).
        base = 21000 + (os.getpid() % 150) * 200
        self.gcs_port = base
        self.object_store_bytes = object_store_bytes
        self.nodes: dict[str, RayNode] = {}
        for i, n in enumerate(names):
            p = base + 10 + i * 60
            extra = (daemon_args or {}).get(n, ())
            if llm_upstream is not None:
                # Each node's LLM proxy on its own loopback port, to one
                # upstream: an agent outside calls its session's node.
                extra = (*extra, "--llm-upstream", f"openai={llm_upstream}")
            d = make(
                k0 + i,
                store_gib=(store_gib or {}).get(n, 4),
                extra_args=extra,
                llm_proxy_local=f"127.0.0.1:{p + 2}" if llm_upstream is not None else "off",
            )
            self.nodes[n] = RayNode(n, d, p, p + 1, p + 10, p + 59)
        self.address = f"{LOOPBACK}:{self.gcs_port}"
        self.llm: Any = None
        """The mock upstream its user runs, if any."""

    # ---- start --------------------------------------------------------------

    def start(self) -> None:
        """Every drumsd, then every Ray node (head first); on a failure,
        whatever started is stopped again."""
        try:
            for node in self.nodes.values():
                node.daemon.start()
            for i, node in enumerate(self.nodes.values()):
                self._ray_start(node, head=i == 0)
            import ray

            # This process is the cluster's driver, on loopback too.
            ray.init(address=self.address, _node_ip_address=LOOPBACK, log_to_driver=False)
            self._learn_node_ids()
        except BaseException:
            self.stop(check=False)
            raise

    def env(self, node: RayNode | None = None) -> dict[str, str]:
        """The environment of a Ray process here (a node, or the driver)."""
        env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            # Every process of the cluster inherits it: how stop() finds them.
            CLUSTER_MARK: str(self.temp_dir),
            # A node whose raylet is killed is known dead within about a
            # second, not Ray's default 15 s (read by the head's GCS).
            "RAY_health_check_period_ms": "300",
            "RAY_health_check_timeout_ms": "300",
            "RAY_health_check_failure_threshold": "3",
            # Ray's workers import drums from where this test imports it.
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        if node is not None:
            env["DRUMS_SOCKET"] = str(node.daemon.socket)
            env["DRUMS_NO_AUTOSTART"] = "1"
        return env

    def _ray_start(self, node: RayNode, *, head: bool) -> None:
        args = [
            str(ray_bin()),
            "start",
            f"--node-ip-address={LOOPBACK}",
            "--num-cpus=1",
            f"--resources={json.dumps({node.resource: 1})}",
            f"--node-manager-port={node.node_manager_port}",
            f"--object-manager-port={node.object_manager_port}",
            f"--min-worker-port={node.min_worker_port}",
            f"--max-worker-port={node.max_worker_port}",
            f"--object-store-memory={self.object_store_bytes}",
            # The agents' ports too, each node its own (the defaults clash).
            f"--dashboard-agent-listen-port={node.node_manager_port + 3}",
            f"--dashboard-agent-grpc-port={node.node_manager_port + 4}",
            f"--metrics-export-port={node.node_manager_port + 5}",
            f"--runtime-env-agent-port={node.node_manager_port + 6}",
            "--disable-usage-stats",
        ]
        if head:
            args += [
                "--head",
                f"--port={self.gcs_port}",
                f"--temp-dir={self.temp_dir}",
                "--include-dashboard=false",
            ]
        else:
            args += [f"--address={self.address}"]
        # On a loaded 2-core host a raylet can miss `ray start`'s 30 s for
        # registering with the GCS: what that start left is killed, and it is
        # tried again, at most three times in all.
        for attempt in range(3):
            r = subprocess.run(
                args, env=self.env(node), capture_output=True, text=True, timeout=180
            )
            if r.returncode == 0:
                return
            left = set(node.raylet_pids())
            if head:
                left |= set(_pids_with(str(self.temp_dir))) | set(_pids_with(self.address))
            left.discard(os.getpid())
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            print(
                f"ray start for node {node.name} failed (attempt {attempt + 1} of 3):\n"
                f"{r.stderr[-2000:]}",
                file=sys.stderr,
            )
            time.sleep(1)
        raise RuntimeError(f"ray start for node {node.name} failed:\n{r.stdout}\n{r.stderr}")

    def _learn_node_ids(self) -> None:
        import ray

        deadline = time.monotonic() + 60
        while True:
            ids = {}
            for n in ray.nodes():  # type: ignore[no-untyped-call]
                if not n.get("Alive"):
                    continue
                for node in self.nodes.values():
                    if node.resource in n["Resources"]:
                        ids[node.name] = n["NodeID"]
            if len(ids) == len(self.nodes):
                for name, nid in ids.items():
                    self.nodes[name].node_id = nid
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {sorted(ids)} of the Ray nodes came up")
            time.sleep(0.2)

    # ---- trust ----------------------------------------------------------------

    def trust(self, truster: str, trusted: str) -> None:
        """`truster`'s drumsd accepts archives signed by `trusted`'s key (the
        operator's step: `drums key show` there, a line in trusted-keys here)."""
        import drums

        with drums.Client(self.nodes[trusted].daemon.socket, autostart=False) as c:
            line = c.host_key().trusted_keys_line
        f = self.nodes[truster].daemon.state / "trusted-keys"
        if not f.exists():
            f.write_text("drums-trusted-keys 1\n")
        with open(f, "a") as out:
            out.write(line + "\n")

    # ---- faults -----------------------------------------------------------------

    def kill_node(self, name: str) -> None:
        """The node is lost: `kill -9` of its raylet (and with it the node's
        workers and actor) and its drumsd, then of its sessions' processes."""
        node = self.nodes[name]
        for pid in node.raylet_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        node.daemon.kill9()
        node.killed = True
        cg = node.daemon.cgroup_parent
        for pid in _pids_in_cgroup(cg):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    # ---- stop -------------------------------------------------------------------

    def ray_pids(self) -> list[int]:
        """Every process of this cluster: its temp dir or GCS address in the
        command line, one of its nodes' ports, the cluster's mark in its
        environment, or a file of the temp dir open (Ray's agents rewrite
        their command line and environment, but keep their logs open)."""
        pids = set(_pids_with(str(self.temp_dir))) | set(_pids_with(self.address))
        pids |= set(_pids_with(f"{CLUSTER_MARK}={self.temp_dir}", "environ"))
        pids |= set(_pids_holding(str(self.temp_dir)))
        for node in self.nodes.values():
            pids |= set(node.raylet_pids())
        pids.discard(os.getpid())
        return sorted(pids)

    def stop(self, *, check: bool = True) -> None:
        """Stop Ray (every process of this cluster: SIGTERM, then SIGKILL),
        then every drumsd, and prove that nothing is left: with `check`, by
        raising; without (after a failed start), by saying so on stderr."""
        with contextlib.suppress(Exception):
            import ray

            ray.shutdown()
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            for pid in self.ray_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while self.ray_pids() and time.monotonic() < deadline:
                time.sleep(0.1)
        left = self.ray_pids()
        errors = []
        for node in self.nodes.values():
            try:
                if node.killed:
                    node.daemon.start()
                    node.killed = False
                node.daemon.stop_and_check()
            except Exception as e:
                errors.append(f"node {node.name}: {e}")
                node.daemon.kill9()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if left:
            errors.append(f"Ray processes left: {left}")
        if errors:
            msg = "the Ray cluster left things behind:\n" + "\n".join(errors)
            if check:
                raise AssertionError(msg)
            # Stopping after a failed start: the start's error is the one
            # raised; this one is said.
            print(msg, file=sys.stderr)


def _pids_in_cgroup(parent: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cg = (p / "cgroup").read_text()
        except OSError:
            continue
        if f"/{parent}/" in cg:
            out.append(int(p.name))
    return out
