"""The daemon as a process: an autostart, and a drumsd killed mid-stream.

Each test runs a throwaway drumsd of its own (other names than the run's),
so killing it touches nothing else, and cleans up after it: a killed
daemon's leftovers are swept by starting it again on the same state
directory, then SIGTERM and the same leak check as the run's daemon.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import drums
from tests.conftest import require_daemon
from tests.daemon import IMAGES_DIR, Daemon, bin_dir, pick_k


@pytest.fixture
def throwaway() -> Iterator[Daemon]:
    require_daemon()
    d = Daemon(pick_k(offset=97))
    try:
        yield d
    finally:
        if d.proc is not None:
            d.kill9()
        # Sweep what a killed daemon left, then prove it is all gone.
        again = Daemon(d.k, state=d.state)
        again.start()
        again.stop_and_check()


def test_killed_mid_stream_is_daemon_unavailable(throwaway: Daemon) -> None:
    throwaway.start()
    with drums.Client(throwaway.socket, autostart=False) as c:
        sb = drums.Sandbox.create(client=c)
        out: list[str] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                sb.commands.run(
                    "echo started; sleep 60; echo never", timeout=None, on_stdout=out.append
                )
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=run)
        t.start()
        deadline = time.monotonic() + 30
        while not out and time.monotonic() < deadline:
            time.sleep(0.01)
        assert out == ["started\n"]
        throwaway.kill9()
        t.join(30)
        assert not t.is_alive(), "commands.run did not return after drumsd died"
        assert len(errors) == 1
        assert isinstance(errors[0], drums.DaemonUnavailable), repr(errors[0])
        assert errors[0].__cause__ is not None or "without an exit status" in str(errors[0])
        # And with nothing answering, autostart off: DaemonUnavailable at once.
        with pytest.raises(drums.DaemonUnavailable, match="autostart is off"):
            c.version()


def _wrapper(path: Path, d: Daemon) -> None:
    """A drumsd that takes the autostart's --state-dir and --socket and adds
    the test's names, so an autostarted daemon meets no other."""
    path.write_text(
        "#!/bin/sh\n"
        f'exec {bin_dir() / "drumsd"} "$@" --images-dir {IMAGES_DIR} --bin-dir {bin_dir()} '
        f"--bridge {d.bridge} --subnet {d.subnet} --cgroup-parent {d.cgroup_parent} "
        "--store-gib 4 --llm-proxy-local off\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_autostart_starts_drumsd_as_the_cli_does(throwaway: Daemon, tmp_path: Path) -> None:
    exe = tmp_path / "drumsd-wrapper"
    _wrapper(exe, throwaway)
    with drums.Client(state_dir=throwaway.state, autostart=True, drumsd=str(exe)) as c:
        assert c.socket == throwaway.state / "drumsd.sock"
        v = c.version()
        assert v.state_dir == str(throwaway.state)
        with drums.Sandbox.create(client=c) as sb:
            assert sb.commands.run("echo up").stdout == "up\n"
    log = (throwaway.state / "drumsd.log").read_text()
    assert log, "an autostarted drumsd logs to STATE/drumsd.log"
    # Not our child to wait for: its own session, as the CLI's setsid.
    assert os.getsid(v.pid) == v.pid
    os.kill(v.pid, 15)
    # This process started it, so this process reaps it.
    (child,) = [p for p in drums._sync._client._STARTED if p.pid == v.pid]
    assert child.wait(60) == 0


def test_autostart_failure_says_why(tmp_path: Path) -> None:
    fake = tmp_path / "fake-drumsd"
    fake.write_text("#!/bin/sh\necho 'fake drumsd: refusing to start' >&2\nexit 3\n")
    fake.chmod(0o755)
    with (
        drums.Client(state_dir=tmp_path / "state", autostart=True, drumsd=str(fake)) as c,
        pytest.raises(drums.DaemonUnavailable) as e,
    ):
        c.version()
    assert "fake drumsd: refusing to start" in e.value.message
    assert str(tmp_path / "state" / "drumsd.log") in e.value.message


def test_socket_and_state_dir_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DRUMS_SOCKET", raising=False)
    monkeypatch.setenv("DRUMS_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("DRUMS_NO_AUTOSTART", "1")
    with drums.Client() as c:
        assert c.socket == tmp_path / "drumsd.sock"
        assert c.autostart is False
        with pytest.raises(drums.DaemonUnavailable):
            c.version()
    monkeypatch.setenv("DRUMS_SOCKET", str(tmp_path / "other.sock"))
    monkeypatch.setenv("DRUMS_NO_AUTOSTART", "false")
    with drums.Client() as c:
        assert c.socket == tmp_path / "other.sock"
        assert c.autostart is True
    monkeypatch.delenv("DRUMS_STATE_DIR")
    monkeypatch.delenv("DRUMS_SOCKET")
    with drums.Client() as c:
        assert c.socket == Path("/var/lib/drums/drumsd.sock")
