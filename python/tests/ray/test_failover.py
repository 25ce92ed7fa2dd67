"""Sessions that survive the loss of their node, on a real 3-node Ray cluster
of this module's own (the kill leaves node c dead for the rest of it).

A coordinated agent outside its session (its model calls through the
session's node's LLM proxy, the official openai SDK, a mock upstream; its
commands through the cluster handle) runs the same 5 steps twice, on node c
with its versions replicated to node b: once without a fault, once with
node c killed (`kill -9` of its raylet, its drumsd and its sessions'
processes) while a command runs. Both runs must end with the same answers,
outputs and files; the second on node b. A session on node c that was not
replicated gets a clear error."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import openai
import pytest

import drums
import drums.ray
from drums.ray.demo import KILL_AT_STEP, STEPS
from tests.ray.cluster import RayCluster

# The demo's agent script: one command per step; step 2 runs while the
# node is killed.


def run_agent(
    sb: drums.ray.ClusterSandbox, model: str, on_step: Any = None
) -> list[tuple[str, str, int | None]]:
    """The agent: ask the model, run what it says, tell it the output."""
    messages: list[Any] = [{"role": "user", "content": "do the task"}]
    transcript = []
    for step in range(len(STEPS)):
        while True:
            client = openai.OpenAI(
                base_url=sb.llm_base_url(), api_key="none", max_retries=0, timeout=120
            )
            try:
                r = client.chat.completions.create(model=model, messages=messages)
                break
            except openai.APIConnectionError:
                # The node went down under the call: ask again where the
                # session is now (the guard answers once it moved).
                time.sleep(0.2)
            finally:
                client.close()
        call = r.choices[0].message.tool_calls[0]  # type: ignore[index]
        command = json.loads(call.function.arguments)["command"]  # type: ignore[union-attr]
        if on_step is not None:
            on_step(step)
        result = sb.commands.run(command)
        transcript.append((command, result.stdout, result.exit_code))
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": result.stdout},
        ]
    return transcript


def files_of(sb: drums.ray.ClusterSandbox) -> str:
    return sb.commands.run("cat /root/log /root/w/a").stdout


def test_a_replicated_agent_survives_the_loss_of_its_node(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    a, b, n_c = (cluster.nodes[x].node_id for x in ("a", "b", "c"))
    cluster.llm.script("agent", STEPS)

    # Without a fault.
    with c.create(node=n_c, replicate=True, replica=b, name="calm") as calm:
        assert calm.replicated
        expected = run_agent(calm, "agent")
        expected_files = files_of(calm)
        assert calm.node.id == n_c
        # Every answer whose turn took a version was held for its replica,
        # and got it (a turn that changed nothing takes none: step 3 reads).
        turns = calm.turns()
        versioned = [t for t in turns if t.version is not None]
        assert len(versioned) >= 4, turns
        assert [t.replica for t in versioned] == ["acked"] * len(versioned)
        assert [t.replica for t in turns if t.version is None] == [None] * (
            len(turns) - len(versioned)
        )
        copies = [t.replica_ms for t in versioned]
    assert [out for _, out, _ in expected] == [
        "1\n",
        "a\n",
        "one\nthree\n",
        "two\n2\n",
        "done\n",
    ]
    assert expected_files == "one\nthree\ntwo\n"
    assert all(ms > 0 for ms in copies)

    plain = c.create(node=n_c, name="plain")
    sb = c.create(node=n_c, replicate=True, replica=b, name="stormy")
    killed_at: list[float] = []

    def kill_soon(step: int) -> None:
        if step == KILL_AT_STEP:

            def kill() -> None:
                killed_at.append(time.time())
                cluster.kill_node("c")

            threading.Timer(0.5, kill).start()

    try:
        got = run_agent(sb, "agent", on_step=kill_soon)
        answered_at = time.time()
        assert killed_at, "node c was never killed"
        # The same answers, outputs and files as without the fault, on b.
        assert got == expected
        assert files_of(sb) == expected_files
        assert sb.node.id == b
        assert sb.name == "stormy"
        (f,) = [f for f in c.failovers() if f.name == "stormy"]
        assert (f.lost_node, f.to_node, f.error) == (n_c, b, None)
        assert f.version is not None
        # Noticed and resumed within seconds of the kill.
        assert f.missed_at <= f.noticed_at <= f.resumed_at, f
        assert killed_at[0] <= f.noticed_at, f
        assert f.noticed_at - killed_at[0] < 5, f
        assert f.resumed_at - killed_at[0] < 10, f
        assert answered_at > f.resumed_at
        # Its versions go on to the third node now.
        guarded = ray_sessions(c)
        assert [(p, r) for name, p, r, _ in guarded.values() if name == "stormy"] == [(b, a)]
        # The session that was not replicated is lost with its node: it says so.
        with pytest.raises((drums.ray.NodeLost, drums.DaemonUnavailable)):
            plain.commands.run("true")
        # The calm session was removed before the kill: nothing to resume.
        assert [f.name for f in c.failovers()] == ["stormy"]
    finally:
        sb.kill()
    # Nothing of it is left on a or b (c's drumsd is dead; the cluster's
    # stop restarts it so its sweep removes what the kill left).
    for name in ("a", "b"):
        with drums.Client(cluster.nodes[name].daemon.socket, autostart=False) as cl:
            assert drums.Sandbox.list(client=cl) == []
            assert cl.checkpoints.list() == []


def ray_sessions(c: drums.ray.Cluster) -> dict[str, tuple[str, str, str | None, str | None]]:
    import ray

    from drums.ray._guard import guard

    found: dict[str, tuple[str, str, str | None, str | None]] = ray.get(guard().sessions.remote())
    return found
