"""Fixtures: one real drumsd for the whole run, clients of it, and a check
after every test that it left no session, checkpoint or pool behind.

Without root or the default image these tests FAIL when
DRUMS_REQUIRE_ROOT_TESTS=1 (CI sets it) and otherwise skip, saying so loudly
at the end of the run: they never report a pass.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest

import drums
from tests.daemon import Daemon, pick_k, preconditions

_SKIPPED: list[str] = []


def require_daemon() -> None:
    why = preconditions()
    if why is None:
        return
    if os.environ.get("DRUMS_REQUIRE_ROOT_TESTS") == "1":
        pytest.fail(f"{why}. DRUMS_REQUIRE_ROOT_TESTS=1: NOT SKIPPED, failing on purpose")
    _SKIPPED.append(why)
    pytest.skip(f"SKIPPED, NOT PASSED: {why}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SKIPPED:
        terminalreporter.section("drums: tests against a real drumsd were SKIPPED", sep="!")
        terminalreporter.write_line(f"reason: {_SKIPPED[0]}")
        terminalreporter.write_line("they did NOT pass; CI sets DRUMS_REQUIRE_ROOT_TESTS=1 to fail")


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """The run's drumsd; at the end, SIGTERM and proof that nothing is left."""
    require_daemon()
    d = Daemon(pick_k())
    d.start()
    try:
        yield d
    finally:
        d.stop_and_check()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def client(daemon: Daemon) -> Iterator[drums.Client]:
    """A client of the run's drumsd (autostart off: a dead daemon must fail)."""
    with drums.Client(daemon.socket, autostart=False) as c:
        yield c


@pytest.fixture
async def async_client(daemon: Daemon) -> AsyncIterator[drums.AsyncClient]:
    """An async client of the run's drumsd, on the test's event loop."""
    async with drums.AsyncClient(daemon.socket, autostart=False) as c:
        yield c


@pytest.fixture(autouse=True)
def _leaves_nothing(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the daemon: no session, checkpoint or pool is
    left (checked through the API, then removed so one failure stays one)."""
    yield
    if "daemon" not in request.fixturenames:
        return
    d: Daemon = request.getfixturevalue("daemon")
    with drums.Client(d.socket, autostart=False) as c:
        left: list[str] = []
        try:
            pools = c.pools.list()
        except drums.NotFound:
            pools = []  # a drumsd without /v1/pools (the pool tests say so)
        for p in pools:
            left.append(f"pool {p.name}")
            drums.Pool.connect(p.id, client=c).remove()
        for sb in drums.Sandbox.list(client=c):
            left.append(f"session {sb.name}")
            sb.kill()
        for ck in c.checkpoints.list():
            left.append(f"checkpoint {ck.name}")
            ck.remove()
        assert not left, f"the test left {', '.join(left)} behind"
        assert not d.veths(), f"veths left on {d.bridge}: {d.veths()}"
