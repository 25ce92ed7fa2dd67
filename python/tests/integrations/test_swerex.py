"""drums.integrations.swerex against a real drumsd: SWE-ReX's runtime
interface over a drums session."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest
from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    DeploymentNotStartedError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    BashAction,
    BashInterruptAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)

import drums
from drums.integrations.swerex import DrumsDeployment, DrumsDeploymentConfig
from tests.daemon import Daemon

pytestmark = pytest.mark.anyio


async def test_bash_session_keeps_state(daemon: Daemon) -> None:
    dep = DrumsDeployment(socket=str(daemon.socket))
    assert not await dep.is_alive()
    with pytest.raises(DeploymentNotStartedError):
        _ = dep.runtime
    await dep.start()
    try:
        assert await dep.is_alive()
        rt = dep.runtime
        await rt.create_session(CreateBashSessionRequest())
        with pytest.raises(SessionExistsError):
            await rt.create_session(CreateBashSessionRequest())
        run = rt.run_in_session
        obs = await run(BashAction(command="cd /tmp && export GREETING='hello there'"))
        assert obs.exit_code == 0 and obs.output == ""
        # cd, exported and plain variables, functions: all persist.
        obs = await run(BashAction(command="pwd; echo $GREETING; f() { echo in f; }; X=2"))
        assert obs.output == "/tmp\nhello there\n"
        obs = await run(BashAction(command="f; echo $X; echo to stderr >&2"))
        assert obs.output == "in f\n2\nto stderr\n"
        # Several lines, a heredoc, quotes: the command is a file's text.
        obs = await run(BashAction(command="cat <<'EOF'\n$NOT 'expanded' \"x\"\nEOF\necho done"))
        assert obs.output == "$NOT 'expanded' \"x\"\ndone\n"
        # Exit codes, and check's three modes.
        obs = await run(BashAction(command="false", check="silent"))
        assert obs.exit_code == 1
        assert (await run(BashAction(command="false", check="ignore"))).exit_code is None
        with pytest.raises(NonZeroExitCodeError, match="exit code 3"):
            await run(BashAction(command="(exit 3)"))
        with pytest.raises(BashIncorrectSyntaxError):
            await run(BashAction(command="if then fi ("))
        # The session is still usable after those.
        assert (await run(BashAction(command="pwd"))).output == "/tmp\n"
        # A timeout leaves the command running; an interrupt stops it.
        with pytest.raises(CommandTimeoutError):
            await run(BashAction(command="sleep 30; echo late", timeout=1))
        obs = await run(BashInterruptAction(timeout=5))
        assert obs.exit_code == 0
        assert (await run(BashAction(command="echo after"))).output == "after\n"
        # A second session is a bash of its own.
        await rt.create_session(CreateBashSessionRequest(session="two"))
        obs = await run(BashAction(command="pwd", session="two"))
        assert obs.output != "/tmp\n"
        await rt.close_session(CloseBashSessionRequest(session="two"))
        with pytest.raises(SessionDoesNotExistError):
            await run(BashAction(command="pwd", session="two"))
        # A command that ends the bash ends its session.
        with pytest.raises(Exception, match="exited"):
            await run(BashAction(command="exit 0", timeout=30))
        with pytest.raises(SessionDoesNotExistError):
            await run(BashAction(command="pwd"))
    finally:
        await dep.stop()
    assert not await dep.is_alive()


async def test_execute_and_files(daemon: Daemon, tmp_path: Path) -> None:
    dep = DrumsDeployment(socket=str(daemon.socket))
    await dep.start()
    try:
        rt = dep.runtime
        r = await rt.execute(Command(command=["echo", "a b", "$HOME"]))
        assert (r.stdout, r.stderr, r.exit_code) == ("a b $HOME\n", "", 0)
        r = await rt.execute(Command(command="echo out; echo err >&2; exit 4", shell=True))
        assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 4)
        r = await rt.execute(
            Command(command="echo out; echo err >&2", shell=True, merge_output_streams=True)
        )
        assert (r.stdout, r.stderr) == ("out\nerr\n", "")
        r = await rt.execute(Command(command=["sh", "-c", "echo $A-$HOME"], env={"A": "1"}))
        assert r.stdout == "1-\n"  # env= is the whole environment, as in subprocess
        r = await rt.execute(Command(command=["pwd"], cwd="/etc"))
        assert r.stdout == "/etc\n"
        with pytest.raises(NonZeroExitCodeError):
            await rt.execute(Command(command=["false"], check=True))
        with pytest.raises(CommandTimeoutError):
            await rt.execute(Command(command=["sleep", "30"], timeout=1))
        with pytest.raises(FileNotFoundError):
            await rt.execute(Command(command=["no-such-program"]))

        await rt.write_file(WriteFileRequest(path="/work/new/dir/f.txt", content="héllo\n"))
        got = await rt.read_file(ReadFileRequest(path="/work/new/dir/f.txt"))
        assert got.content == "héllo\n"
        with pytest.raises(FileNotFoundError):
            await rt.read_file(ReadFileRequest(path="/work/missing"))

        src = tmp_path / "proj"
        (src / "pkg").mkdir(parents=True)
        (src / "pkg" / "mod.py").write_text("X = 1\n")
        (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
        (src / "run.sh").chmod(0o755)
        (src / "link").symlink_to("pkg/mod.py")
        await rt.upload(UploadRequest(source_path=str(src), target_path="/work/proj"))
        r = await rt.execute(Command(command="cd /work/proj && ./run.sh && cat link", shell=True))
        assert r.stdout == "ran\nX = 1\n"
        await rt.upload(
            UploadRequest(source_path=str(src / "pkg" / "mod.py"), target_path="/work/one/m.py")
        )
        assert (await rt.read_file(ReadFileRequest(path="/work/one/m.py"))).content == "X = 1\n"
        with pytest.raises(ValueError, match="not a file or directory"):
            await rt.upload(UploadRequest(source_path=str(tmp_path / "nope"), target_path="/x"))
        await rt.close()
    finally:
        await dep.stop()


def test_a_loop_per_call_and_a_deployment_never_stopped(daemon: Daemon) -> None:
    """As mini-swe-agent's SWE-ReX environments call it (asyncio.run each
    time); and a deployment dropped without stop() takes its session along."""
    dep = DrumsDeploymentConfig(socket=str(daemon.socket)).get_deployment()
    asyncio.run(dep.start())
    asyncio.run(dep.runtime.create_session(CreateBashSessionRequest()))
    asyncio.run(dep.runtime.run_in_session(BashAction(command="cd /etc")))
    obs = asyncio.run(dep.runtime.run_in_session(BashAction(command="pwd")))
    assert obs.output == "/etc\n"
    sid = dep.sandbox_id
    del dep, obs
    gc.collect()
    with drums.Client(daemon.socket, autostart=False) as c:
        assert sid not in {s.id for s in drums.Sandbox.list(client=c)}


async def test_bad_image_leaves_nothing(daemon: Daemon) -> None:
    dep = DrumsDeployment(socket=str(daemon.socket), image="no-such-image")
    with pytest.raises(drums.NotFound, match="no-such-image"):
        await dep.start()
    assert not await dep.is_alive()
    with pytest.raises(ValueError, match="extra"):
        DrumsDeployment(socket=str(daemon.socket), imgae="default")
