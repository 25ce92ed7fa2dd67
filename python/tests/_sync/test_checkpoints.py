# GENERATED from tests/_async/test_checkpoints.py by scripts/unasync.py: do not edit.
"""Checkpoints, forks, versions, turns, the inspector, jobs and the daemon's
own calls, against the run's real drumsd (both twins)."""

from __future__ import annotations

import os
import signal
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import drums
from drums.models import AuditReport, Capacity, HostKey, SessionVersion, TurnEffects, Version


def unsigned_copy(src: Path, dst: Path) -> None:
    """The archive without its signature.json: an unsigned archive."""
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        for m in tin:
            if m.name != "signature.json":
                tout.addfile(m, tin.extractfile(m) if m.isfile() else None)


def test_checkpoint_restore_export_import(
    client: drums.Client, tmp_path: Path
) -> None:
    with drums.Sandbox.create(client=client) as sb:
        sb.files.write("/root/mark", "before")
        ck = sb.checkpoint(name="py-ck")
        assert (ck.name, ck.info.session_id) == ("py-ck", sb.id)
        # The SDK's default keeps the session running.
        assert (sb.refresh()).state == "running"
        try:
            assert [c.id for c in client.checkpoints.list()] == [ck.id]
            assert (client.checkpoints.get("py-ck")).id == ck.id
            sibs = ck.restore(2)
            try:
                assert len({s.id for s in sibs}) == 2
                for s in sibs:
                    assert s.info.origin == ck.id
                    assert s.files.read("/root/mark") == "before"
                report = client.audit(sibs[0].id, sibs[1].id)
                assert isinstance(report, AuditReport)
                assert report.passed, report
            finally:
                for s in sibs:
                    s.kill()
            (one,) = ck.restore(name="py-named-sib")
            assert one.name == "py-named-sib"
            one.kill()
            archive = tmp_path / "ck.tar"
            size = ck.export(archive)
            assert size == archive.stat().st_size > 0
            assert not (tmp_path / "ck.tar.part").exists()
            with open(tmp_path / "ck2.tar", "wb") as f:
                assert ck.export(f) == size
            # By chunks, never whole: none is over the size asked for.
            chunks: list[bytes] = []
            for c in ck.iter_export(64 << 10):
                chunks.append(c)
            assert max(len(c) for c in chunks) <= 64 << 10
            assert sum(len(c) for c in chunks) == size
        finally:
            ck.remove()
        with pytest.raises(drums.NotFound):
            client.checkpoints.get("py-ck")
        # Signed by this host, whose key it trusts.
        imported = client.checkpoints.import_(archive)
        assert imported.name == "py-ck"
        assert imported.id != ck.id
        imported.remove()

        # From an iterable of chunks, under a name of the caller's.
        def chunks_of(path: Path) -> Iterator[bytes]:
            with open(path, "rb") as src:
                while b := src.read(1 << 20):
                    yield b

        renamed = client.checkpoints.import_(chunks_of(archive), name="py-renamed")
        assert renamed.name == "py-renamed"
        # A name taken is a conflict; a bad one is refused before the upload.
        with pytest.raises(drums.Conflict):
            client.checkpoints.import_(chunks_of(archive), name="py-renamed")
        with pytest.raises(drums.InvalidArgument):
            client.checkpoints.import_(archive, name="../up")
        renamed.remove()

        # An upload that breaks off keeps nothing.
        def broken(path: Path) -> Iterator[bytes]:
            with open(path, "rb") as src:
                yield src.read(1 << 20)
            raise OSError("the sender vanished")

        with pytest.raises(OSError, match="the sender vanished"):
            client.checkpoints.import_(broken(archive), name="py-broken")
        assert [c.name for c in client.checkpoints.list()] == []
        unsigned = tmp_path / "unsigned.tar"
        unsigned_copy(archive, unsigned)
        with pytest.raises(drums.Untrusted) as ue:
            client.checkpoints.import_(unsigned)
        assert ue.value.status == 403
        with open(unsigned, "rb") as uf:
            trusted = client.checkpoints.import_(uf, trust_unsigned=True)
        trusted.remove()


def test_fork_turns_versions_rollback_recover(client: drums.Client) -> None:
    with drums.Sandbox.create(client=client) as sb:
        begun = sb.turn.begin()
        assert begun.turn == 1
        with sb.inspect() as stream:
            sb.commands.run("echo one > /root/f")
            fx = sb.turn.end(checkpoint=True, policy="full", wait=True)
            assert isinstance(fx, TurnEffects)
            assert fx.class_ in ("files", "both")
            assert any(f.path == "/root/f" for f in fx.files)
            assert fx.checkpoint is not None and fx.checkpoint.version is not None
            v1 = fx.checkpoint.version
            assert v1.state == "done"
            seen = stream.__next__()
            assert seen.turn == 1
        sb.turn.begin()
        sb.commands.run("echo two > /root/f; touch /root/bad")
        fx2 = sb.turn.end(checkpoint=True, policy="full")
        assert fx2.checkpoint is not None and fx2.checkpoint.job
        job = client.jobs.promote(fx2.checkpoint.job)
        assert job.id == fx2.checkpoint.job
        job = client.jobs.get(job.id, wait=True)
        assert job.state == "done", job
        versions = sb.versions()
        assert all(isinstance(v, SessionVersion) for v in versions)
        assert [v.number for v in versions] == [1, 2]
        # Back to before the bad turn: same session, its files as they were.
        info = sb.rollback(to=v1.number)
        assert info.id == sb.id
        assert sb.files.read("/root/f") == "one\n"
        assert not sb.files.exists("/root/bad")
        assert sb.turns() == []  # no model call went through the proxy
        marked = sb.mark_agent(1)
        assert 1 in marked.pids
        sb.stop_inspecting()
        # Its processes die; recover brings it back from its newest version.
        assert sb.info.init_pid is not None
        os.kill(sb.info.init_pid, signal.SIGKILL)
        for _ in range(100):
            try:
                os.kill(sb.info.init_pid, 0)
            except ProcessLookupError:
                break
            drums._backends.sleep(0.02)
        recovered = sb.recover()
        assert recovered.state == "running"
        assert recovered.init_pid != info.init_pid
        # The newest done version is the second turn's.
        assert sb.files.read("/root/f") == "two\n"
        forks = sb.fork(2)
        try:
            assert len(forks) == 2
            for f in forks:
                assert f.files.read("/root/f") == "two\n"
        finally:
            for f in forks:
                f.kill()
        (at_v1,) = sb.fork(at=v1.number, name="py-fork-at")
        assert at_v1.name == "py-fork-at"
        assert at_v1.files.read("/root/f") == "one\n"
        at_v1.kill()
        (kept,) = sb.fork(keep=True)
        kept.kill()
        for ck in client.checkpoints.list():
            ck.remove()
    with pytest.raises(drums.Conflict):
        with drums.Sandbox.create(client=client) as sb:
            sb.turn.end()  # no turn is open


def test_daemon_calls(client: drums.Client, daemon: object) -> None:
    v = client.version()
    assert isinstance(v, Version)
    assert v.api == "v1"
    k = client.host_key()
    assert isinstance(k, HostKey)
    assert k.key.startswith("ed25519 ")
    cap = client.capacity()
    assert isinstance(cap, Capacity)
    assert cap.sessions == 0 and cap.cpus >= 1 and cap.memory_available_bytes > 0
    doc = client.openapi()
    assert "operationId: createSession" in doc
    # A fault point fails the next create with drumsd's own error.
    client.debug.set_fault("create.subvolume")
    try:
        with pytest.raises(drums.InternalError) as ie:
            drums.Sandbox.create(client=client)
        assert ie.value.status == 500
    finally:
        client.debug.set_fault(None)
    with drums.Sandbox.create(client=client):
        pass


def test_the_replication_gate(client: drums.Client) -> None:
    with drums.Sandbox.create(client=client) as sb:
        with pytest.raises(drums.NotFound):
            sb.replication.state()
        g = sb.replication.on(timeout=5)
        assert (g.session, g.timeout_ms, g.pending, g.last_acked) == (sb.id, 5000, (), None)
        assert (sb.replication.on(timeout=2.5)).timeout_ms == 2500
        # No answer waits on a version: nothing to copy.
        assert sb.replication.next(wait=0.05) is None
        sb.turn.begin()
        fx = sb.turn.end(checkpoint=True, policy="full", wait=True)
        assert fx.checkpoint is not None and fx.checkpoint.version is not None
        v = fx.checkpoint.version.id
        sb.replication.ack(v)
        assert (sb.replication.state()).last_acked == v
        with pytest.raises(drums.NotFound):
            sb.replication.ack("not-a-version")
        with pytest.raises(drums.InvalidArgument):
            sb.replication.on(timeout=601)
        assert sb.replication.off()
        assert not sb.replication.off()
        with pytest.raises(drums.NotFound):
            sb.replication.next()
