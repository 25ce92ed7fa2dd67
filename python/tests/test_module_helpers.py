"""The module-level helpers and the default clients they use (drums.* for
sync code, drums.aio.* for async code), against the run's drumsd."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import drums
import drums.aio
from tests.daemon import Daemon


@pytest.fixture
def default_socket(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The default clients made from the environment, pointed at the run's drumsd."""
    monkeypatch.setenv("DRUMS_SOCKET", str(daemon.socket))
    monkeypatch.setenv("DRUMS_NO_AUTOSTART", "1")
    drums.set_default_client(None)
    yield
    drums.default_client().close()
    drums.set_default_client(None)


def test_sync_helpers_use_the_default_client(default_socket: None, daemon: Daemon) -> None:
    assert drums.default_client().socket == daemon.socket
    assert drums.version().state_dir == str(daemon.state)
    assert drums.host_key().key.startswith("ed25519 ")
    assert "openapi: 3" in drums.openapi()
    assert drums.checkpoints.list() == []
    assert drums.pools.list() == []
    assert any(i.name == "default" for i in drums.images.list())
    with pytest.raises(drums.NotFound):
        drums.jobs.get("no-such-job")
    drums.debug.set_fault(None)
    a, b = drums.Sandbox.create(), drums.Sandbox.create()
    try:
        assert {s.id for s in drums.Sandbox.list()} == {a.id, b.id}
        assert drums.Sandbox.connect(a.name).id == a.id
        cap = drums.capacity()
        assert cap.sessions == 2
        assert cap.max_sessions is None
        limits = [s.info.limits.memory_bytes or 0 for s in (a, b)]
        assert cap.memory_committed_bytes == sum(limits) > 0
        assert cap.default_memory_bytes == limits[0]
        assert cap.memory_available_bytes > 0
        assert cap.cpus == os.cpu_count()
        report = drums.audit(a, b)
        assert report.a == a.id or report.a == a.name
    finally:
        a.kill()
        b.kill()
    # One's own client can be the default (the one it replaces is not closed).
    made = drums.default_client()
    with drums.Client(daemon.socket, autostart=False) as c:
        drums.set_default_client(c)
        assert drums.default_client() is c
    made.close()


@pytest.mark.anyio
async def test_async_helpers_use_the_loops_default_client(
    default_socket: None, daemon: Daemon
) -> None:
    assert (await drums.aio.version()).state_dir == str(daemon.state)
    assert (await drums.aio.host_key()).key.startswith("ed25519 ")
    assert "openapi: 3" in await drums.aio.openapi()
    assert await drums.aio.checkpoints.list() == []
    assert await drums.aio.pools.list() == []
    assert any(i.name == "default" for i in await drums.aio.images.list())
    with pytest.raises(drums.NotFound):
        await drums.aio.jobs.promote("no-such-job")
    await drums.aio.debug.set_fault(None)
    async with await drums.AsyncSandbox.create() as a, await drums.AsyncSandbox.create() as b:
        assert {s.id for s in await drums.AsyncSandbox.list()} == {a.id, b.id}
        assert (await drums.aio.capacity()).sessions == 2
        report = await drums.aio.audit(a, b)
        assert report.passed, report
    from drums._default import async_default_client

    await async_default_client().close()
