"""drums.integrations.minisweagent against a real drumsd, driven by
mini-swe-agent's own agent loop and models."""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from minisweagent.agents import get_agent
from minisweagent.config import get_config_from_spec
from minisweagent.environments import get_environment
from minisweagent.exceptions import Submitted
from minisweagent.models import get_model

import drums
from drums.integrations.minisweagent import DrumsEnvironment, DrumsEnvironmentConfig
from tests.daemon import Daemon

ENV_CLASS = "drums.integrations.minisweagent.DrumsEnvironment"

# A tiny repository whose test fails until calc.add adds.
REPO_SETUP = r"""
set -e
mkdir -p /repo && cd /repo
cat > calc.py <<'EOF'
def add(a, b):
    return a - b
EOF
cat > test_calc.py <<'EOF'
import unittest
from calc import add

class TestAdd(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

if __name__ == "__main__":
    unittest.main()
EOF
git init -q && git add -A && git -c user.email=t@t -c user.name=t commit -qm init
"""

# What a model that knew the fix would run, one command per step.
FIX_STEPS = [
    "cd /repo && python3 -m unittest -q test_calc 2>&1 | tail -1",
    "cd /repo && sed -i 's/return a - b/return a + b/' calc.py && cat calc.py",
    "cd /repo && python3 -m unittest -q test_calc",
    "cd /repo && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff",
]


def _bash_message(i: int, command: str) -> dict[str, Any]:
    """A DeterministicModel answer in the format of mini-swe-agent's
    text-based configs (one ```mswea_bash_command block)."""
    return {
        "role": "assistant",
        "content": f"THOUGHT: step {i}\n\n```mswea_bash_command\n{command}\n```",
        "extra": {"actions": [{"command": command}], "cost": 0.0},
    }


def _agent_config(env: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """mini-swe-agent's bundled default.yaml, with our environment and model
    merged in, as `mini -c default.yaml -c ...` builds it."""
    from minisweagent.utils.serialize import recursive_merge

    cfg: dict[str, Any] = recursive_merge(
        get_config_from_spec("default.yaml"),
        {"environment": env, "model": model, "agent": {"step_limit": 20}},
    )
    return cfg


def _run(cfg: dict[str, Any], task: str) -> tuple[Any, Any, dict[str, Any]]:
    """What mini's `main` does: model, environment, agent from the config, then run."""
    model = get_model(config=cfg.get("model", {}))
    env = get_environment(cfg.get("environment", {}), default_type="local")
    assert isinstance(env, DrumsEnvironment)
    agent = get_agent(model, env, cfg.get("agent", {}), default_type="default")
    try:
        result = agent.run(task)
    except BaseException:
        env.cleanup()
        raise
    return agent, env, result


def _observations(messages: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(returncode, raw output) of each executed action."""
    return [
        (m["extra"]["returncode"], m["extra"]["raw_output"])
        for m in messages
        if m.get("role") in ("user", "tool") and "returncode" in m.get("extra", {})
    ]


def test_deterministic_model_solves_a_repo_task(daemon: Daemon) -> None:
    cfg = _agent_config(
        {
            "environment_class": ENV_CLASS,
            "socket": str(daemon.socket),
            "timeout": 60,
            # The fix keeps calc.py's size, within the second its .pyc was
            # written: the stale bytecode would still be used.
            "env": {"PYTHONDONTWRITEBYTECODE": "1"},
        },
        {
            "model_class": "deterministic",
            "model_name": "deterministic",
            "outputs": [_bash_message(i, c) for i, c in enumerate(FIX_STEPS)],
        },
    )
    env0 = get_environment(cfg["environment"])
    assert isinstance(env0, DrumsEnvironment)
    try:
        env0.sandbox.commands.run(REPO_SETUP, check=True)
        ck_name = env0.sandbox.checkpoint(name="mswea-task").name
    finally:
        env0.cleanup()  # (which closed its client: the test uses its own)
    c = drums.Client(daemon.socket, autostart=False)
    ck = c.checkpoints.get(ck_name)
    try:
        # The task's warm checkpoint, as a SWE-bench-like runner would hold one.
        cfg["environment"]["from_checkpoint"] = ck.name
        agent, env, result = _run(cfg, "Make test_calc pass.")
        try:
            assert result["exit_status"] == "Submitted", agent.messages[-1]
            assert "-    return a - b" in result["submission"]
            assert "+    return a + b" in result["submission"]
            obs = _observations(agent.messages)
            assert obs[0][0] == 0 and "FAILED" in obs[0][1]
            assert obs[1] == (0, "def add(a, b):\n    return a + b\n")
            # unittest writes to stderr: it reaches the output, as with LocalEnvironment.
            assert obs[2][0] == 0 and "OK" in obs[2][1]
            # The trajectory names the environment and its config.
            data = agent.serialize()
            assert data["info"]["config"]["environment_type"] == ENV_CLASS
            assert data["info"]["config"]["environment"]["from_checkpoint"] == "mswea-task"
            json.dumps(data)
            r = env.sandbox.commands.run(
                ["python3", "-m", "unittest", "-q", "test_calc"], cwd="/repo"
            )
            assert r.exit_code == 0
        finally:
            env.cleanup()
    finally:
        ck.remove()
        c.close()


def test_execute_v2_shape_submit_and_timeout(daemon: Daemon) -> None:
    with DrumsEnvironment(socket=str(daemon.socket), env={"GREETING": "hi there"}) as env:
        out = env.execute({"command": "echo $GREETING; echo oops >&2; exit 3"})
        assert out == {"output": "hi there\noops\n", "returncode": 3, "exception_info": ""}
        assert env.execute({"command": "pwd"}, cwd="/tmp")["output"] == "/tmp\n"
        # The marker with a non-zero exit is no submission.
        out = env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; false"})
        assert out["returncode"] == 1
        with pytest.raises(Submitted) as e:
            env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the patch"})
        assert e.value.messages == (
            {
                "role": "exit",
                "content": "the patch\n",
                "extra": {"exit_status": "Submitted", "submission": "the patch\n"},
            },
        )
        # A timeout: the partial output, -1, and the reference's exception text.
        out = env.execute({"command": "echo started; sleep 30"}, timeout=1)
        assert out["returncode"] == -1
        assert out["output"] == "started\n"
        assert out["exception_info"] == (
            "An error occurred while executing the command: "
            "Command 'echo started; sleep 30' timed out after 1 seconds"
        )
        assert out["extra"]["exception_type"] == "TimeoutExpired"
        # An exception (a cwd that does not exist): -1 with extra, no raise.
        out = env.execute({"command": "true"}, cwd="/nonexistent")
        assert out["returncode"] == -1
        assert out["extra"]["exception_type"] == "NotFound"
        assert out["exception_info"].startswith("An error occurred while executing the command: ")
        # Template variables: the config, and the sandbox's uname.
        tv = env.get_template_vars(extra=1)
        assert tv["system"] == "Linux" and tv["machine"] and tv["extra"] == 1
        assert tv["env"] == {"GREETING": "hi there"} and tv["session"] == env.sandbox.name
        assert env.serialize()["info"]["config"]["environment"]["timeout"] == 30


def test_execute_v1_signature(daemon: Daemon) -> None:
    """1.x's `execute(command: str)`: directly, and as 1.x's DefaultAgent
    calls it (its execute_action, has_finished and timeout handling)."""
    with DrumsEnvironment(socket=str(daemon.socket)) as env:
        assert env.execute("echo hi") == {"output": "hi\n", "returncode": 0}
        assert env.execute("exit 7", "/tmp") == {"output": "", "returncode": 7}
        # 1.x's agent: the environment leaves the marker to it...
        out = env.execute("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo done")
        assert out["returncode"] == 0
        assert _v1_has_finished(out) == "done\n"
        # ...and its timeout is subprocess's, with the output as bytes.
        with pytest.raises(subprocess.TimeoutExpired) as e:
            env.execute("echo partial; sleep 30", timeout=1)
        assert e.value.output == b"partial\n"


def _v1_has_finished(output: dict[str, Any]) -> str | None:
    """mini-swe-agent 1.x's DefaultAgent.has_finished, as a function."""
    lines = output.get("output", "").lstrip().splitlines(keepends=True)
    if lines and lines[0].strip() in (
        "MINI_SWE_AGENT_FINAL_OUTPUT",
        "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
    ):
        if output.get("returncode", 0) != 0:
            return None
        return "".join(lines[1:])
    return None


def test_default_session_and_its_removal(daemon: Daemon) -> None:
    """No arguments: a session of drumsd's defaults, through the default
    client (DRUMS_SOCKET); it goes with cleanup(), with collection, and at
    interpreter exit."""
    env = DrumsEnvironment()
    sid = env.sandbox.id
    assert env.execute({"command": "cat /etc/debian_version"})["returncode"] == 0
    env.cleanup()
    env.cleanup()  # once only
    with drums.Client(daemon.socket, autostart=False) as c:
        assert sid not in {s.id for s in drums.Sandbox.list(client=c)}
        env = DrumsEnvironment()
        sid = env.sandbox.id
        del env
        gc.collect()
        assert sid not in {s.id for s in drums.Sandbox.list(client=c)}
    # At exit: a child interpreter makes one and exits without cleanup().
    code = (
        "from drums.integrations.minisweagent import DrumsEnvironment\n"
        "env = DrumsEnvironment()\n"
        "print(env.sandbox.id, flush=True)\n"
        "keep = [env]\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with drums.Client(daemon.socket, autostart=False) as c:
        assert r.stdout.strip() not in {s.id for s in drums.Sandbox.list(client=c)}


def test_yaml_selects_it(daemon: Daemon, tmp_path: Path) -> None:
    cfg_file = tmp_path / "drums.yaml"
    cfg_file.write_text(
        yaml.safe_dump(
            {
                "environment": {
                    "environment_class": ENV_CLASS,
                    "cwd": "/tmp",
                    "timeout": 10,
                    "env": {"A": "1"},
                    "sandbox_kwargs": {"memory": "256M"},
                }
            }
        )
    )
    cfg = get_config_from_spec(str(cfg_file))
    env = get_environment(cfg["environment"])
    assert isinstance(env, DrumsEnvironment)
    try:
        assert env.execute({"command": "pwd; echo $A"})["output"] == "/tmp\n1\n"
        assert env.sandbox.info.limits.memory_bytes == 256 << 20
    finally:
        env.cleanup()


def test_pool_member(daemon: Daemon) -> None:
    with drums.Client(daemon.socket, autostart=False) as c:
        with drums.Sandbox.create(client=c) as sb:
            sb.commands.run("echo warm > /root/state", check=True)
            ck = sb.checkpoint()
        try:
            with drums.Pool(ck, size=1, name="mswea-pool", client=c) as pool:
                env = DrumsEnvironment(socket=str(daemon.socket), from_checkpoint="pool=mswea-pool")
                try:
                    assert env.execute({"command": "cat /root/state"})["output"] == "warm\n"
                    assert pool.info().taken == 1
                finally:
                    env.cleanup()
        finally:
            ck.remove()


def test_bad_input_leaves_nothing(daemon: Daemon) -> None:
    with pytest.raises(drums.NotFound, match="no-such-image"):
        DrumsEnvironment(socket=str(daemon.socket), image="no-such-image")
    with pytest.raises(drums.NotFound):
        DrumsEnvironment(socket=str(daemon.socket), from_checkpoint="no-such-checkpoint")
    with pytest.raises(ValueError, match="timeout"):
        DrumsEnvironmentConfig(timeout="soon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="from_checkpoint"):
        DrumsEnvironmentConfig(from_checkpoint="ck", image="default")
    with pytest.raises(ValueError, match="not coordinated"):
        _ = DrumsEnvironment(socket=str(daemon.socket)).model_base_url
    # (the autouse check proves no session, checkpoint or pool is left; the
    # environment that raised above was collected, which removed its session)
    gc.collect()


def test_drums_imports_without_the_harness() -> None:
    """`import drums` and this module import no harness."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('minisweagent', 'litellm', 'swerex'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import drums, drums.integrations.minisweagent as m\n"
        "assert not [k for k in sys.modules if re.match('minisweagent|litellm|swerex', k)]\n"
    )
    code = "import re\n" + code
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not re.search("Traceback", r.stderr)
