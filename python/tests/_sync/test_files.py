# GENERATED from tests/_async/test_files.py by scripts/unasync.py: do not edit.
"""Files in a session, against the run's real drumsd (both twins)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

import drums
from drums.models import DirEntry, Written


def test_write_read_list_exists_remove(client: drums.Client) -> None:
    with drums.Sandbox.create(client=client) as sb:
        w = sb.files.write("/tmp/a.txt", "héllo\n")
        assert w == Written(path="/tmp/a.txt", size=7)
        assert sb.files.read("/tmp/a.txt") == "héllo\n"
        # Relative paths are taken from the session's root.
        assert sb.files.read("tmp/a.txt", format="bytes") == "héllo\n".encode()
        sb.files.write("/tmp/b.bin", b"\x00\xff", mode=0o600)
        sb.files.write("/tmp/c", bytearray(b"c"), mode="0755")
        entries = sb.files.list("/tmp")
        by_name = {e.name: e for e in entries}
        assert by_name["b.bin"] == DirEntry(name="b.bin", kind="file", size=2, mode="0600")
        assert by_name["c"].mode == "0755"
        sb.commands.run(["mkdir", "-p", "/tmp/d/e"], check=True)
        assert {e.name: e.kind for e in sb.files.list("/tmp")}["d"] == "dir"
        assert sb.files.exists("/tmp/a.txt")
        assert sb.files.exists("/tmp/d")
        assert not sb.files.exists("/tmp/nope")
        # A path is an argv element, never shell text.
        odd = "/tmp/$(touch pwned); x"
        sb.files.write(odd, "odd")
        assert sb.files.exists(odd)
        sb.files.remove(odd)
        assert not sb.files.exists(odd)
        assert not sb.files.exists("/pwned")
        sb.files.remove("/tmp/d")
        assert not sb.files.exists("/tmp/d")
        sb.files.remove("/tmp/never-was")  # no error: rm -rf


def test_big_files_stream_both_ways(client: drums.Client, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    data = os.urandom(1 << 20) * 9  # 9 MiB: many chunks each way
    src.write_bytes(data)
    with drums.Sandbox.create(client=client) as sb:
        with open(src, "rb") as f:
            w = sb.files.write("/tmp/big.bin", f)
        assert w.size == len(data)
        s = sb.files.read("/tmp/big.bin", format="stream")
        assert s.mode == "0644"
        got = bytearray()
        chunks = 0
        with s:
            for chunk in s:
                got += chunk
                chunks += 1
        assert bytes(got) == data
        assert chunks > 1
        r = sb.commands.run(["sha256sum", "/tmp/big.bin"])
        import hashlib

        assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
        # A stream closed early ends the transfer without reading the rest.
        s = sb.files.read("/tmp/big.bin", format="stream")
        with s:
            for _ in s:
                break


def test_file_errors(client: drums.Client) -> None:
    with drums.Sandbox.create(client=client) as sb:
        with pytest.raises(drums.NotFound):
            sb.files.read("/no/such/file")
        with pytest.raises(drums.PathEscapesRoot) as pe:
            sb.files.read("../../etc/passwd")
        assert "escapes" in pe.value.message
        with pytest.raises(drums.InvalidArgument):
            sb.files.read("/tmp")  # a directory
        with pytest.raises(drums.InvalidArgument):
            sb.files.list("/etc/passwd")  # not a directory
        with pytest.raises(drums.NotFound):
            sb.files.write("/no/such/dir/f", "x")
        with pytest.raises(TypeError):
            sb.files.write("/tmp/f", 42)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            sb.files.write("/tmp/f", io.StringIO("text"))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="format"):
            sb.files.read("/etc/passwd", format="json")  # type: ignore[call-overload]
        # The session's own permissions (403 from its guest).
        with pytest.raises(drums.PermissionDenied):
            sb.commands.run("true", user="nobody", cwd="/root")
