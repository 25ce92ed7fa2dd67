"""Files in a session, against the run's real drumsd (both twins)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

import drums
from drums.models import DirEntry, Written


@pytest.mark.anyio
async def test_write_read_list_exists_remove(async_client: drums.AsyncClient) -> None:
    async with await drums.AsyncSandbox.create(client=async_client) as sb:
        w = await sb.files.write("/tmp/a.txt", "héllo\n")
        assert w == Written(path="/tmp/a.txt", size=7)
        assert await sb.files.read("/tmp/a.txt") == "héllo\n"
        # Relative paths are taken from the session's root.
        assert await sb.files.read("tmp/a.txt", format="bytes") == "héllo\n".encode()
        await sb.files.write("/tmp/b.bin", b"\x00\xff", mode=0o600)
        await sb.files.write("/tmp/c", bytearray(b"c"), mode="0755")
        entries = await sb.files.list("/tmp")
        by_name = {e.name: e for e in entries}
        assert by_name["b.bin"] == DirEntry(name="b.bin", kind="file", size=2, mode="0600")
        assert by_name["c"].mode == "0755"
        await sb.commands.run(["mkdir", "-p", "/tmp/d/e"], check=True)
        assert {e.name: e.kind for e in await sb.files.list("/tmp")}["d"] == "dir"
        assert await sb.files.exists("/tmp/a.txt")
        assert await sb.files.exists("/tmp/d")
        assert not await sb.files.exists("/tmp/nope")
        # A path is an argv element, never shell text.
        odd = "/tmp/$(touch pwned); x"
        await sb.files.write(odd, "odd")
        assert await sb.files.exists(odd)
        await sb.files.remove(odd)
        assert not await sb.files.exists(odd)
        assert not await sb.files.exists("/pwned")
        await sb.files.remove("/tmp/d")
        assert not await sb.files.exists("/tmp/d")
        await sb.files.remove("/tmp/never-was")  # no error: rm -rf


@pytest.mark.anyio
async def test_big_files_stream_both_ways(async_client: drums.AsyncClient, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    data = os.urandom(1 << 20) * 9  # 9 MiB: many chunks each way
    src.write_bytes(data)
    async with await drums.AsyncSandbox.create(client=async_client) as sb:
        with open(src, "rb") as f:
            w = await sb.files.write("/tmp/big.bin", f)
        assert w.size == len(data)
        s = await sb.files.read("/tmp/big.bin", format="stream")
        assert s.mode == "0644"
        got = bytearray()
        chunks = 0
        async with s:
            async for chunk in s:
                got += chunk
                chunks += 1
        assert bytes(got) == data
        assert chunks > 1
        r = await sb.commands.run(["sha256sum", "/tmp/big.bin"])
        import hashlib

        assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
        # A stream closed early ends the transfer without reading the rest.
        s = await sb.files.read("/tmp/big.bin", format="stream")
        async with s:
            async for _ in s:
                break


@pytest.mark.anyio
async def test_file_errors(async_client: drums.AsyncClient) -> None:
    async with await drums.AsyncSandbox.create(client=async_client) as sb:
        with pytest.raises(drums.NotFound):
            await sb.files.read("/no/such/file")
        with pytest.raises(drums.PathEscapesRoot) as pe:
            await sb.files.read("../../etc/passwd")
        assert "escapes" in pe.value.message
        with pytest.raises(drums.InvalidArgument):
            await sb.files.read("/tmp")  # a directory
        with pytest.raises(drums.InvalidArgument):
            await sb.files.list("/etc/passwd")  # not a directory
        with pytest.raises(drums.NotFound):
            await sb.files.write("/no/such/dir/f", "x")
        with pytest.raises(TypeError):
            await sb.files.write("/tmp/f", 42)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await sb.files.write("/tmp/f", io.StringIO("text"))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="format"):
            await sb.files.read("/etc/passwd", format="json")  # type: ignore[call-overload]
        # The session's own permissions (403 from its guest).
        with pytest.raises(drums.PermissionDenied):
            await sb.commands.run("true", user="nobody", cwd="/root")
