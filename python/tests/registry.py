"""A real distribution v2 registry (Debian's `docker-registry`) on loopback,
and a tiny OCI image to push into it with skopeo: what the Rust tests do
(crates/testkit/src/registry.rs), so that `images.pull` meets the
server it meets in the field."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import socket
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

REGISTRY_BIN = "/usr/bin/docker-registry"
SKOPEO_BIN = "/usr/bin/skopeo"


def missing() -> str | None:
    for b in (REGISTRY_BIN, SKOPEO_BIN):
        if not os.path.exists(b):
            return f"{b} missing: run scripts/setup.sh"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Registry:
    """An anonymous registry on 127.0.0.1:PORT, its storage under `dir`."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        last = ""
        for _ in range(5):  # a bind race with another process is retried
            self.port = _free_port()
            cfg = self.dir / "config.yml"
            cfg.write_text(
                "version: 0.1\n"
                "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
                f"storage:\n  filesystem:\n    rootdirectory: {self.dir / 'storage'}\n"
                f"http:\n  addr: {self.addr}\n  secret: drums-test-registry\n"
            )
            log = open(self.dir / "registry.log", "wb")  # noqa: SIM115 - the child's
            with log:
                self.proc = subprocess.Popen(
                    [REGISTRY_BIN, "serve", str(cfg)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    # REGISTRY_* variables would override the file.
                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://{self.addr}/v2/", timeout=2) as r:
                        if r.status == 200:
                            return
                except OSError:
                    time.sleep(0.05)
            last = (self.dir / "registry.log").read_text(errors="replace")
            self.stop()
            if "address already in use" not in last:
                break
        raise RuntimeError(f"docker-registry did not come up:\n{last}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def push(self, layout: Path, name_tag: str) -> None:
        subprocess.run(
            [
                SKOPEO_BIN, "--insecure-policy", "copy", "--quiet", "--all",
                "--preserve-digests", "--dest-tls-verify=false",
                f"oci:{layout}", f"docker://{self.addr}/{name_tag}",
            ],
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip


def _blob(layout: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs/sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_busybox_layout(layout: Path, tag: str, marker: str) -> None:
    """An OCI layout with one image: a static busybox and a file holding
    `marker` (so two calls make two different images)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as t:
        for d in ("bin", "etc"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            t.addfile(ti)
        t.add("/bin/busybox", arcname="bin/busybox")
        ti = tarfile.TarInfo("bin/sh")
        ti.type, ti.linkname = tarfile.SYMTYPE, "busybox"
        t.addfile(ti)
        data = marker.encode()
        ti = tarfile.TarInfo("etc/marker")
        ti.size, ti.mode = len(data), 0o644
        t.addfile(ti, io.BytesIO(data))
    write_layout(layout, raw.getvalue(), tag)


def write_layout(layout: Path, tar: bytes, tag: str, history: str | None = None) -> None:
    """An OCI layout at `layout` (made here) holding one linux/amd64 image
    of one layer, the uncompressed `tar`, named `tag`; `history` gives its
    config one history entry (buildah wants one per layer)."""
    (layout / "blobs/sha256").mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    layer = _blob(layout, gzip.compress(tar, mtime=0))
    config: dict[str, object] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(tar).hexdigest()}"]},
    }
    if history is not None:
        config["history"] = [{"created_by": history}]
    config_blob = _blob(layout, json.dumps(config).encode())
    manifest = _blob(
        layout,
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_blob},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
            }
        ).encode(),
    )
    (layout / "index.json").write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        **manifest,
                        "platform": {"architecture": "amd64", "os": "linux"},
                        "annotations": {"org.opencontainers.image.ref.name": tag},
                    }
                ],
            }
        )
    )


def to_oci_archive(layout: Path, tag: str, file: Path) -> None:
    subprocess.run(
        [SKOPEO_BIN, "--insecure-policy", "copy", "--quiet", "--all",
         f"oci:{layout}:{tag}", f"oci-archive:{file}:{tag}"],
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
