"""drums.integrations.harbor: `harbor run` (Harbor 0.26, the oracle agent)
over local tasks whose Dockerfiles are FROM a base on a loopback registry,
built by `drums build` and run in the run's drumsd; and bad input.

The base is busybox (its applets linked in /bin), `/bin/bash` a two-line
shim that runs busybox's sh (Harbor runs every command under `bash -c`),
`/etc/passwd` with root and `agent` (uid 1000), `/tmp`. Only the harbor venv
($cache/harbor) runs this file; `harbor` is its console script.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import drums
from tests import registry as reg
from tests.daemon import Daemon, bin_dir

HARBOR = Path(sys.executable).parent / "harbor"
ENV_CLASS = "drums.integrations.harbor:DrumsEnvironment"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples/integrations/harbor_job.py"
BASE = "harbor/base:1"


# ---- the base image and the registry -------------------------------------------


def _file(t: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode = len(data), mode
    t.addfile(ti, io.BytesIO(data))


def write_base_layout(layout: Path) -> None:
    """An OCI layout of the tasks' base image (see the module's docstring)."""
    applets = subprocess.run(
        ["/bin/busybox", "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as t:
        for d, mode in (("bin", 0o755), ("etc", 0o755), ("tmp", 0o1777), ("root", 0o700)):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, mode
            t.addfile(ti)
        t.add("/bin/busybox", arcname="bin/busybox")
        for a in applets:
            if a in ("busybox", "bash"):
                continue
            ti = tarfile.TarInfo(f"bin/{a}")
            ti.type, ti.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(ti)
        _file(t, "bin/bash", b'#!/bin/sh\nexec /bin/sh "$@"\n', 0o755)
        _file(t, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/tmp:/bin/sh\n")
        _file(t, "etc/group", b"root:x:0:\nagent:x:1000:\n")
    reg.write_layout(layout, raw.getvalue(), "1", history="tests/integrations/test_harbor.py")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[reg.Registry]:
    """A loopback registry serving the tasks' base as `harbor/base:1`."""
    why = reg.missing()
    if why is not None:
        if os.environ.get("DRUMS_REQUIRE_ROOT_TESTS") == "1":
            pytest.fail(f"{why}. NOT SKIPPED: failing on purpose")
        pytest.skip(f"SKIPPED, NOT PASSED: {why}")
    d = tmp_path_factory.mktemp("harbor-registry")
    r = reg.Registry(d)
    r.start()
    try:
        write_base_layout(d / "layout")
        r.push(d / "layout", BASE)
        yield r
    finally:
        r.stop()


@pytest.fixture
def built(daemon: Daemon) -> Iterator[None]:
    """Removes the images the test's builds made (drums keeps them as its
    build cache; the leak check wants none left)."""
    yield
    with drums.Client(daemon.socket, autostart=False) as c:
        for img in c.images.list():
            if any(n.startswith("localhost/harbor-") or "/harbor/" in n for n in img.names):
                c.images.remove(img.id or img.name)


# ---- tasks -----------------------------------------------------------------------


def write_task(
    root: Path,
    name: str,
    *,
    dockerfile: str | None,
    solve: str,
    test: str,
    files: dict[str, str] | None = None,
    environment: str = "",
) -> Path:
    """A task in Harbor's format under `root/name`."""
    t = root / name
    (t / "environment").mkdir(parents=True)
    (t / "solution").mkdir()
    (t / "tests").mkdir()
    (t / "task.toml").write_text(
        'schema_version = "1.4"\n\n[agent]\ntimeout_sec = 60.0\n\n'
        "[verifier]\ntimeout_sec = 60.0\n\n"
        f"[environment]\nbuild_timeout_sec = 300.0\n{environment}"
    )
    (t / "instruction.md").write_text(f"Task {name}: see tests/test.sh.\n")
    if dockerfile is not None:
        (t / "environment/Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        (t / "environment" / rel).write_text(text)
    (t / "solution/solve.sh").write_text("#!/bin/bash\nset -e\n" + solve)
    (t / "tests/test.sh").write_text(
        "#!/bin/bash\n"
        f"if {test}; then echo 1 > /logs/verifier/reward.txt;"
        " else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    return t


def good_tasks(root: Path, registry: reg.Registry) -> dict[str, float]:
    """Four tasks the oracle solves, one whose solution is wrong: name -> reward."""
    base = f"FROM {registry.addr}/{BASE}\n"
    write_task(
        root,
        "copy-workdir",
        dockerfile=base + "WORKDIR /app\nCOPY data.txt /app/data.txt\nRUN chmod 666 data.txt\n",
        files={"data.txt": "42\n"},
        # A relative path: the image's WORKDIR is where commands run.
        solve="echo $(( $(cat data.txt) + 1 )) > answer.txt\n",
        test='[ "$(cat /app/answer.txt)" = 43 ]',
    )
    write_task(
        root,
        "env-user",
        dockerfile=base + "ENV GREETING=hello\nRUN mkdir /home && mkdir -m 700 /home/agent"
        " && chown agent:agent /home/agent\nUSER agent\nWORKDIR /home/agent\n",
        solve='echo "$GREETING from $(id -un)" > /home/agent/out.txt\n',
        test='[ "$(cat /home/agent/out.txt)" = "hello from agent" ]',
        environment="cpus = 0.5\nmemory_mb = 256\n",
    )
    write_task(
        root,
        "run-layers",
        dockerfile=base + "RUN mkdir -p /opt/tool && printf 'a\\nb\\nc\\n' > /opt/tool/in\n"
        "COPY check.sh /opt/tool/check.sh\nRUN chmod +x /opt/tool/check.sh\n",
        files={"check.sh": '#!/bin/sh\n[ "$(sort -r /opt/tool/in | head -n1)" = "$1" ]\n'},
        solve="sort -r /opt/tool/in | head -n1 > /tmp/top\n",
        test='/opt/tool/check.sh "$(cat /tmp/top)"',
    )
    write_task(
        root,
        "wrong-solution",
        dockerfile=base + "WORKDIR /srv\n",
        solve="echo no > /srv/answer\n",
        test='[ "$(cat /srv/answer)" = yes ]',
    )
    # No Dockerfile: the base itself, pulled; environment/ uploaded into the
    # task's workdir (made: the image has not got it), as Harbor does.
    write_task(
        root,
        "prebuilt",
        dockerfile=None,
        files={"notes.txt": "from environment/\n"},
        solve="cp notes.txt answer.txt\n",
        test='[ "$(cat /srv/task/answer.txt)" = "from environment/" ]',
        environment=f'docker_image = "{registry.addr}/{BASE}"\nworkdir = "/srv/task"\n',
    )
    return {
        "copy-workdir": 1.0,
        "env-user": 1.0,
        "run-layers": 1.0,
        "prebuilt": 1.0,
        "wrong-solution": 0.0,
    }


# ---- harbor run --------------------------------------------------------------------


def harbor_env(tmp: Path) -> dict[str, str]:
    """Harbor offline and quiet: no telemetry, its own HOME, the current CLI first."""
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    return {
        **os.environ,
        "PATH": f"{bin_dir()}:{os.environ['PATH']}",
        "HOME": str(home),
        "HARBOR_TELEMETRY": "0",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "DRUMS_NO_AUTOSTART": "true",  # the CLI takes true|false
        "PYTHONPATH": str(Path(drums.__file__).resolve().parents[1]),
    }


def harbor_cmd(
    daemon: Daemon, tasks: Path, tmp: Path, job: str
) -> subprocess.CompletedProcess[str]:
    """`harbor run` of the oracle over `tasks` with the drums environment."""
    argv = [
        str(HARBOR), "run", "-p", str(tasks), "-a", "oracle", "-e", ENV_CLASS,
        "--ek", f"socket={daemon.socket}", "--ek", f"state_dir={daemon.state}",
        "--ek", "insecure=true", "--ek", f"drums={bin_dir() / 'drums'}",
        "-o", str(tmp / "jobs"), "--job-name", job, "-n", "2", "-y", "-q",
    ]  # fmt: skip
    return subprocess.run(
        argv, env=harbor_env(tmp), capture_output=True, text=True, timeout=300, cwd=tmp
    )


def harbor_run(daemon: Daemon, tasks: Path, tmp: Path, job: str) -> dict[str, Any]:
    """`harbor_cmd`, then the job's result.json (its exit status says
    nothing of the trials: 0 even when they error)."""
    r = harbor_cmd(daemon, tasks, tmp, job)
    assert r.returncode == 0, f"harbor run failed:\n{r.stdout}\n{r.stderr}"
    result = tmp / "jobs" / job / "result.json"
    assert result.is_file(), f"no {result}:\n{r.stdout}\n{r.stderr}"
    out: dict[str, Any] = json.loads(result.read_text())
    return out


def failed(r: subprocess.CompletedProcess[str]) -> str:
    """A failed `harbor run`'s output, its rich boxes and wrapping undone."""
    assert r.returncode != 0, r.stdout
    text = (r.stdout + r.stderr).replace("│", " ")
    return " ".join("".join(text.split("\n")).split())


def says(out: str, want: str) -> bool:
    """Whether `out` holds `want`, whitespace aside: rich wraps at its width,
    and a line broken at a space cannot be told from one broken in a word, so
    the join in `failed` may drop a space or add none (CI saw "anexecutable")."""
    return "".join(want.split()) in "".join(out.split())


def trials(tmp: Path, job: str) -> dict[str, dict[str, Any]]:
    """Each trial's result.json, by task name."""
    out: dict[str, dict[str, Any]] = {}
    for f in (tmp / "jobs" / job).glob("*/result.json"):
        res = json.loads(f.read_text())
        out[res["task_name"]] = res
    return out


def test_oracle_job(daemon: Daemon, registry: reg.Registry, built: None, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    want = good_tasks(tasks, registry)
    job = harbor_run(daemon, tasks, tmp_path, "oracle")
    got = trials(tmp_path, "oracle")
    assert job["stats"]["n_errored_trials"] == 0, json.dumps(got, indent=1)[-4000:]
    assert set(got) == set(want)
    for name, reward in want.items():
        t = got[name]
        assert t["exception_info"] is None, t["exception_info"]
        assert t["verifier_result"]["rewards"] == {"reward": reward}, (name, t)
    # Every session went with its trial (the autouse check says so too).
    with drums.Client(daemon.socket, autostart=False) as c:
        assert drums.Sandbox.list(client=c) == []


def _one_errored(tmp: Path, job: str, result: dict[str, Any]) -> str:
    assert result["stats"]["n_errored_trials"] == 1, result["stats"]
    (t,) = trials(tmp, job).values()
    info = t["exception_info"]
    assert info is not None
    return f"{info['exception_type']}: {info['exception_message']}"


def test_missing_dockerfile(
    daemon: Daemon, registry: reg.Registry, built: None, tmp_path: Path
) -> None:
    # The environment's _validate_definition, at its constructor: Harbor
    # fails the whole job with it (as its docker environment's own check).
    tasks = tmp_path / "tasks"
    write_task(tasks, "no-dockerfile", dockerfile=None, solve="true\n", test="true")
    out = failed(harbor_cmd(daemon, tasks, tmp_path, "nodf"))
    assert says(out, "FileNotFoundError: drums: the task has no"), out
    assert says(out, "and no [environment].docker_image: nothing to start a session from"), out


def test_missing_image(daemon: Daemon, registry: reg.Registry, built: None, tmp_path: Path) -> None:
    # A prebuilt docker_image the registry does not have, and a FROM of one.
    tasks = tmp_path / "tasks"
    write_task(
        tasks,
        "no-such-image",
        dockerfile=None,
        solve="true\n",
        test="true",
        environment=f'docker_image = "{registry.addr}/harbor/nope:1"\n',
    )
    err = _one_errored(tmp_path, "noimg", harbor_run(daemon, tasks, tmp_path, "noimg"))
    assert "could not pull" in err and "harbor/nope:1" in err, err

    tasks2 = tmp_path / "tasks2"
    write_task(
        tasks2,
        "no-such-base",
        dockerfile=f"FROM {registry.addr}/harbor/nope:1\n",
        solve="true\n",
        test="true",
    )
    err = _one_errored(tmp_path, "nobase", harbor_run(daemon, tasks2, tmp_path, "nobase"))
    assert "SandboxBuildFailedError" in err and "drums build" in err, err


def test_no_task_toml(daemon: Daemon, registry: reg.Registry, tmp_path: Path) -> None:
    # Harbor's own check: a directory without task.toml is no task, and a -p
    # of no task is refused before any environment is made.
    task = write_task(tmp_path / "tasks", "t", dockerfile="FROM x\n", solve="true\n", test="true")
    (task / "task.toml").unlink()
    out = failed(harbor_cmd(daemon, task, tmp_path, "notoml"))
    assert says(out, "ValueError: Either datasets or tasks must be provided."), out


def test_preflight(daemon: Daemon, registry: reg.Registry, tmp_path: Path) -> None:
    # Before any trial, once per job: an unknown option, a drums CLI that is
    # not there, a drumsd that does not answer.
    task = write_task(tmp_path / "tasks", "t", dockerfile="FROM x\n", solve="true\n", test="true")
    for ek, want in [
        ("nosuch=1", "Unknown option 'nosuch'."),
        (f"drums={tmp_path}/nope", f"drums: the drums CLI {tmp_path}/nope is not an executable"),
        (f"socket={tmp_path}/none.sock", "drums: drumsd does not answer"),
        ('sandbox_kwargs={"image": "x"}', "set by the environment itself: image"),
        ('sandbox_kwargs={"nope": 1}', "not arguments of AsyncSandbox.create: nope"),
    ]:
        argv = [str(HARBOR), "run", "-p", str(task), "-a", "oracle", "-e", ENV_CLASS,
                "--ek", ek, "-o", str(tmp_path / "jobs"), "-y", "-q"]  # fmt: skip
        r = subprocess.run(argv, env=harbor_env(tmp_path), capture_output=True, text=True)
        out = failed(r)
        assert says(out, want), (ek, out)
    assert not (tmp_path / "jobs").exists()


def test_example_job(daemon: Daemon, registry: reg.Registry, built: None, tmp_path: Path) -> None:
    env = harbor_env(tmp_path)
    env["DRUMS_SOCKET"] = str(daemon.socket)
    env["DRUMS_STATE_DIR"] = str(daemon.state)
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--base", f"{registry.addr}/{BASE}", "--insecure"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    assert "mean reward 1.0 over 2 trials, 0 errored" in r.stdout, r.stdout


# ---- the environment in-process: Harbor's calls and drums' extras --------------------


@pytest.mark.anyio
async def test_environment_calls(
    daemon: Daemon, registry: reg.Registry, built: None, tmp_path: Path
) -> None:
    from harbor.models.task.config import (  # type: ignore[import-untyped]
        EnvironmentConfig,
        NetworkMode,
        NetworkPolicy,
    )
    from harbor.models.trial.paths import TrialPaths  # type: ignore[import-untyped]

    from drums.integrations.harbor import DrumsEnvironment

    task = write_task(
        tmp_path / "tasks",
        "calls",
        dockerfile=f"FROM {registry.addr}/{BASE}\nWORKDIR /w\n",
        solve="true\n",
        test="true",
    )
    trial = TrialPaths(tmp_path / "trial")
    trial.mkdir()
    env = DrumsEnvironment(
        environment_dir=task / "environment",
        environment_name="calls",
        session_id="calls__x__env",
        trial_paths=trial,
        task_env_config=EnvironmentConfig(cpus=0.5, memory_mb=256, storage_mb=512),
        socket=str(daemon.socket),
        state_dir=str(daemon.state),
        insecure=True,
        drums=str(bin_dir() / "drums"),
    )
    assert env.type() == "drums"
    await env.start(force_build=False)
    try:
        info = env.sandbox.info
        assert info.egress == "nat"  # Harbor's default policy is public
        assert info.limits.memory_bytes == 256 << 20, info.limits
        # Harbor's /logs dirs, made as its docker environment makes them.
        r = await env.exec("stat -c %a /logs/agent /logs/verifier /logs/artifacts")
        assert r.stdout == "777\n777\n777\n", r
        # The image's WORKDIR, the merged env, stderr apart, the exit status.
        r = await env.exec('pwd; echo "$X"; echo err >&2; exit 3', env={"X": "y"})
        assert (r.stdout, r.stderr, r.return_code) == ("/w\ny\n", "err\n", 3)
        r = await env.exec("id -un", user="agent", cwd="/tmp")
        assert r.stdout == "agent\n", r
        with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
            await env.exec("sleep 30", timeout_sec=1)
        # A command longer than the SDK's default 60 s is not cut at 60 s
        # when Harbor gives no timeout: checked by the timeout passed on.
        # upload_dir merges; modes kept, files root's.
        a, b = tmp_path / "a", tmp_path / "b"
        (a / "sub").mkdir(parents=True)
        (a / "sub/x").write_text("x")
        (b / "sub").mkdir(parents=True)
        (b / "sub/y").write_text("y")
        (b / "run.sh").write_text("#!/bin/sh\necho ran\n")
        (b / "run.sh").chmod(0o755)
        await env.upload_dir(a, "/d")
        await env.upload_dir(b, "/d")
        r = await env.exec("cat /d/sub/x /d/sub/y; /d/run.sh; stat -c '%U %a' /d/run.sh")
        assert r.stdout == "xyran\nroot 755\n", r
        await env.upload_file(b / "run.sh", "/new/dir/run.sh")
        assert (await env.exec("/new/dir/run.sh")).stdout == "ran\n"
        # download_dir overwrites into the host directory; download_file.
        out = tmp_path / "out"
        (out / "sub").mkdir(parents=True)
        (out / "sub/x").write_text("old")
        await env.exec("echo new > /d/sub/x; mkfifo /d/fifo")
        await env.download_dir("/d", out)
        assert (out / "sub/x").read_text() == "new\n"
        assert (out / "sub/y").read_text() == "y"
        assert not (out / "fifo").exists()  # a FIFO is skipped
        await env.download_file("/d/sub/y", tmp_path / "f/y")
        assert (tmp_path / "f/y").read_text() == "y"
        assert not (await env.exec("ls /tmp/.drums-harbor-* 2>/dev/null")).stdout
        # drums' extras: rollback to a turn's version, fork.
        await env.sandbox.turn.begin()
        await env.exec("echo one > /w/f")
        fx = await env.sandbox.turn.end(checkpoint=True, policy="full", wait=True)
        assert fx.checkpoint is not None and fx.checkpoint.version is not None
        await env.exec("echo two > /w/f")
        await env.rollback(fx.checkpoint.version.number)
        assert (await env.exec("cat f")).stdout == "one\n"
        (sib,) = await env.fork(1)
        try:
            r2 = await sib.commands.run(["cat", "/w/f"])
            assert r2.stdout == "one\n"
            assert sib.id != env.sandbox.id
        finally:
            await sib.kill()
    finally:
        await env.stop(delete=True)
        await env.stop(delete=True)  # twice: nothing more
    with pytest.raises(RuntimeError, match="not started"):
        env.sandbox  # noqa: B018

    # A no-network task: egress none (the image is built already: a cache hit).
    offline = DrumsEnvironment(
        environment_dir=task / "environment",
        environment_name="calls",
        session_id="calls__y__env",
        trial_paths=trial,
        task_env_config=EnvironmentConfig(network_mode="no-network"),
        network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
        socket=str(daemon.socket),
        state_dir=str(daemon.state),
        insecure=True,
        drums=str(bin_dir() / "drums"),
    )
    await offline.start(force_build=False)
    try:
        assert offline.sandbox.info.egress == "none"
    finally:
        await offline.stop(delete=True)


def test_bench_runs(daemon: Daemon, registry: reg.Registry, tmp_path: Path) -> None:
    """bench/integrations/harbor_bench.py keeps working (one iteration, its
    JSON checked); it removes its image, containers and podman storage."""
    bench = Path(__file__).resolve().parents[2] / "bench/integrations/harbor_bench.py"
    argv = [
        sys.executable, str(bench), "--base", f"{registry.addr}/{BASE}", "--insecure",
        "-n", "1", "--json", "--socket", str(daemon.socket), "--state-dir", str(daemon.state),
    ]  # fmt: skip
    r = subprocess.run(argv, env=harbor_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Harbor's docker environment is NOT measured" in r.stderr
    res = json.loads(r.stdout)
    for arm in ("drums", "podman"):
        for what in ("start", "stop", "total"):
            assert res[arm][what]["p50_ms"] > 0, res


# ---- a hostile session against download_dir ---------------------------------------


def _evil_tars(outside: Path) -> dict[str, bytes]:
    """What a hostile session could hand back for `tar -cf`, one attack per
    archive (an extraction stops at its first refusal): an entry that climbs
    out, an absolute one, a symlink out with a file written through it, and a
    hard link to a host file. Each starts with a harmless entry, which shows
    the archive was read."""

    def archive(*entries: tuple[str, dict[str, Any]]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, kw in (("ok.txt", {}), *entries):
                ti = tarfile.TarInfo(name)
                for k, v in kw.items():
                    setattr(ti, k, v)
                data = b"pwned\n"
                if ti.type == tarfile.REGTYPE:
                    ti.size = len(data)
                    t.addfile(ti, io.BytesIO(data))
                else:
                    t.addfile(ti)
        return buf.getvalue()

    return {
        "climb": archive((f"../../../../../..{outside}/climbed", {})),
        "absolute": archive((f"{outside}/absolute", {})),
        "symlink": archive(
            ("link", {"type": tarfile.SYMTYPE, "linkname": str(outside)}), ("link/through", {})
        ),
        "hardlink": archive(("hard", {"type": tarfile.LNKTYPE, "linkname": "/etc/hostname"})),
    }


@pytest.mark.anyio
async def test_a_hostile_session_cannot_write_outside_download_dirs_target(
    daemon: Daemon, registry: reg.Registry, built: None, tmp_path: Path
) -> None:
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    from drums.integrations.harbor import DrumsEnvironment

    task = write_task(
        tmp_path / "tasks",
        "hostile",
        dockerfile=f"FROM {registry.addr}/{BASE}\n",
        solve="true\n",
        test="true",
    )
    trial = TrialPaths(tmp_path / "trial")
    trial.mkdir()
    env = DrumsEnvironment(
        environment_dir=task / "environment",
        environment_name="hostile",
        session_id="hostile__x__env",
        trial_paths=trial,
        task_env_config=EnvironmentConfig(),
        socket=str(daemon.socket),
        state_dir=str(daemon.state),
        insecure=True,
        drums=str(bin_dir() / "drums"),
    )
    outside = tmp_path / "outside"
    outside.mkdir()
    await env.start(force_build=False)
    try:
        # The session's own `tar` answers with the crafted archive, as code
        # in a session may: drums' side must not trust what it reads back.
        await env.exec("mkdir -p /d && rm -f /bin/tar")
        await env.sandbox.files.write("/bin/tar", '#!/bin/sh\ncat /evil.tar > "$2"\n', mode=0o755)
        # What the guest runs for ["tar", ...]: the first tar on PATH.
        assert (await env.exec("which tar; head -c 9 /bin/tar")).stdout == "/bin/tar\n#!/bin/sh"
        for attack, tar in _evil_tars(outside).items():
            await env.sandbox.files.write("/evil.tar", tar)
            target = tmp_path / "target" / attack
            # Refusing the archive is as good as skipping the bad entry; but
            # it must have been read (ok.txt, first, came out).
            with contextlib.suppress(Exception):
                await env.download_dir("/d", target)
            assert (target / "ok.txt").read_text() == "pwned\n", attack
            assert list(outside.iterdir()) == [], f"{attack}: written outside the target"
            if (target / "hard").exists():
                assert not (target / "hard").samefile("/etc/hostname"), attack
    finally:
        await env.stop(delete=True)
