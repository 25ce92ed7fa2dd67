"""Fixtures: one real drumsd for the whole run, clients of it, and a check
after every test that it left no session, checkpoint or pool behind.

Without root or the default image these tests FAIL when
DRUMS_REQUIRE_ROOT_TESTS=1 (CI sets it) and otherwise skip, saying so loudly
at the end of the run: they never report a pass.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

import drums
from tests import spec
from tests.daemon import Daemon, pick_k, preconditions

_SKIPPED: list[str] = []
# Every operation a test sent to the run's drumsd (through the fixtures'
# clients): a full run must have sent each one of the spec's.
_EXERCISED: set[str] = set()
_TESTS = Path(__file__).resolve().parent


def _record(request: httpx.Request) -> None:
    op = spec.operation_of(request.method, request.url.path)
    if op is not None:
        _EXERCISED.add(op)


def require_daemon() -> None:
    why = preconditions()
    if why is None:
        return
    if os.environ.get("DRUMS_REQUIRE_ROOT_TESTS") == "1":
        pytest.fail(f"{why}. DRUMS_REQUIRE_ROOT_TESTS=1: NOT SKIPPED, failing on purpose")
    _SKIPPED.append(why)
    pytest.skip(f"SKIPPED, NOT PASSED: {why}")


def _full_run(config: pytest.Config) -> bool:
    return (
        not config.option.keyword
        and not config.option.markexpr
        and not config.option.deselect
        and all(Path(a).resolve() == _TESTS for a in config.args)
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A full, green run against a daemon fails if some operation of the spec
    was never sent to it by any test."""
    if _SKIPPED or not _EXERCISED or not _full_run(session.config):
        return
    missing = sorted({op for op, _, _ in spec.operations()} - _EXERCISED)
    if missing:
        print(f"\nFAILED: operations no test sent to drumsd: {', '.join(missing)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SKIPPED:
        terminalreporter.section("drums: tests against a real drumsd were SKIPPED", sep="!")
        terminalreporter.write_line(f"reason: {_SKIPPED[0]}")
        terminalreporter.write_line("they did NOT pass; CI sets DRUMS_REQUIRE_ROOT_TESTS=1 to fail")


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """The run's drumsd; at the end, SIGTERM and proof that nothing is left."""
    require_daemon()
    yield from serve(Daemon(pick_k()))


def serve(d: Daemon) -> Iterator[Daemon]:
    """Start `d`, yield it, then stop it and prove that nothing is left (the
    body of a session-scoped `daemon` fixture; tests/integrations' starts its
    drumsd with the LLM proxy on)."""
    d.start()
    with drums.Client(d.socket, autostart=False) as c:
        # The images directory is the host's: a test's own images must go.
        d.images_before = {i.id or i.name for i in c.images.list()}
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
        c._hooks.append(_record)
        yield c


@pytest.fixture
async def async_client(daemon: Daemon) -> AsyncIterator[drums.AsyncClient]:
    """An async client of the run's drumsd, on the test's event loop."""
    async with drums.AsyncClient(daemon.socket, autostart=False) as c:
        c._hooks.append(_record)
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
        for img in c.images.list():
            if (img.id or img.name) not in d.images_before:
                left.append(f"image {img.names or img.id}")
                c.images.remove(img.id or img.name)
        assert not left, f"the test left {', '.join(left)} behind"
        assert not d.veths(), f"veths left on {d.bridge}: {d.veths()}"
