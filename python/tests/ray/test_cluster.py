"""drums.ray on a real 3-node Ray cluster on this host (tests/ray/conftest.py):
discovery, placement, handles from Ray workers, checkpoints that travel
(signed, checked, cached by digest), forks over nodes, and the refusals.

Each test leaves no session or checkpoint on any node (`_clean`), and the
module's end proves Ray and every drumsd left nothing on the host."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import drums
import drums.ray
from drums.ray._node import Staged
from tests.ray.cluster import RayCluster


def _client(rc: RayCluster, name: str) -> drums.Client:
    return drums.Client(rc.nodes[name].daemon.socket, autostart=False)


@pytest.fixture(autouse=True)
def _clean(cluster: RayCluster) -> Iterator[None]:
    """After each test: no session, checkpoint or pool on any node (checked,
    then removed so one failure stays one)."""
    yield
    left = []
    for name, node in cluster.nodes.items():
        if node.killed:
            continue
        with _client(cluster, name) as c:
            for p in c.pools.list():
                left.append(f"{name}: pool {p.name}")
                drums.Pool.connect(p.id, client=c).remove()
            for sb in drums.Sandbox.list(client=c):
                left.append(f"{name}: session {sb.name}")
                sb.kill()
            for ck in c.checkpoints.list():
                left.append(f"{name}: checkpoint {ck.name}")
                ck.remove()
    assert not left, f"the test left: {left}"


def _remove_checkpoints(rc: RayCluster) -> None:
    for name in rc.nodes:
        with _client(rc, name) as c:
            for ck in c.checkpoints.list():
                ck.remove()


def test_discovery_finds_every_node_with_its_drumsd(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    nodes = {n.node_id: n for n in c.nodes()}
    assert set(nodes) == {n.node_id for n in cluster.nodes.values()}
    for node in cluster.nodes.values():
        info = nodes[node.node_id]
        # Each actor talks to its own node's drumsd, on its unix socket.
        assert info.socket == str(node.daemon.socket)
        assert info.capacity.sessions == 0
        assert info.trusted_keys_line.startswith("ed25519 ")
    assert len({n.trusted_keys_line for n in nodes.values()}) == 3
    assert c.unavailable == {}


@pytest.mark.anyio
async def test_placement_spreads_twelve_sessions_over_three_nodes(cluster: RayCluster) -> None:
    c = drums.ray.AsyncCluster()
    sbs = await asyncio.gather(*(c.create() for _ in range(12)))
    try:
        per_node: dict[str, int] = {}
        for sb in sbs:
            per_node[sb.node.id] = per_node.get(sb.node.id, 0) + 1
        assert sorted(per_node.values()) == [4, 4, 4], per_node
        # The handle names its node, and its drumsd agrees.
        for name, node in cluster.nodes.items():
            with _client(cluster, name) as cl:
                here = {s.id for s in drums.Sandbox.list(client=cl)}
            assert here == {sb.id for sb in sbs if sb.node.id == node.node_id}
        caps = {n.node_id: n.capacity for n in await c.nodes()}
        assert sorted(cap.sessions for cap in caps.values()) == [4, 4, 4]
        # Node c is full by its own limit (--max-sessions 4): two more go
        # to a and b, never to c.
        full = cluster.nodes["c"].node_id
        assert caps[full].max_sessions == 4
        more = await asyncio.gather(c.create(), c.create())
        sbs.extend(more)
        assert sorted(sb.node.id for sb in more) == sorted(
            [cluster.nodes["a"].node_id, cluster.nodes["b"].node_id]
        )
        # More memory than any node has: refused, naming each node's reason.
        with pytest.raises(drums.ray.NoCapacity) as nc:
            await c.create(memory=1 << 50)
        for node in cluster.nodes.values():
            assert f"node {node.node_id[:12]}: " in nc.value.message, nc.value.message
        assert "4 sessions of its 4" in nc.value.message
        # Asked for by name, a full node refuses with drumsd's own words.
        with pytest.raises(drums.Conflict):
            sbs.append(await c.create(node=full))
    finally:
        await asyncio.gather(*(sb.kill() for sb in sbs))


@ray.remote(num_cpus=0)
def _in_a_worker(sb: drums.ray.ClusterSandbox) -> tuple[str, str]:
    sb.files.write("/root/from-a-worker", "written by a Ray task")
    return sb.commands.run("hostname").stdout.strip(), sb.files.read("/root/from-a-worker")


def test_a_handle_works_from_any_ray_worker(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    with c.create(node=cluster.nodes["b"].node_id) as sb:
        assert sb.node.id == cluster.nodes["b"].node_id
        host, text = ray.get(_in_a_worker.remote(sb))
        assert host == sb.info.hostname
        assert text == "written by a Ray task"
        assert sb.files.read("/root/from-a-worker") == "written by a Ray task"
        r = sb.commands.run(["sh", "-c", "echo $0-$1", "x", "y"])
        assert (r.stdout, r.exit_code) == ("x-y\n", 0)
        with pytest.raises(drums.CommandExitError) as ce:
            sb.commands.run("exit 3", check=True)
        assert ce.value.result.exit_code == 3
        with pytest.raises(drums.NotFound):
            sb.files.read("/root/nothing-here")
    assert not sb.kill()


# Its count is in its memory; the file is only where it shows it (replaced
# whole, so a reader never sees it half-written).
_COUNTER = """\
import os, time
n = 0
while True:
    n += 1
    with open("/tmp/n.tmp", "w") as f:
        f.write(str(n))
    os.replace("/tmp/n.tmp", "/tmp/n")
    time.sleep(0.05)
"""


def test_a_checkpoint_travels_and_the_second_send_moves_nothing(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    a, b = cluster.nodes["a"].node_id, cluster.nodes["b"].node_id
    with c.create(node=a) as sb:
        sb.files.write("/root/mark", "made on node a")
        # A process the checkpoint keeps running, with state in its memory.
        sb.files.write("/root/counter.py", _COUNTER)
        sb.commands.run("nohup python3 /root/counter.py >/dev/null 2>&1 &")
        sb.commands.run("sleep 0.2")
        ck = sb.checkpoint(name="travels")
    try:
        first = c.send(ck, to=b)
        assert first.checkpoint.node.id == b
        assert first.moved_bytes > 0 and not first.cached
        assert first.checkpoint.name == drums.ray.cache_name(_digest(c, ck))
        second = c.send(ck, to=b)
        assert second.cached and second.moved_bytes == 0
        assert second.checkpoint.id == first.checkpoint.id
        (sib,) = first.checkpoint.restore()
        with sib:
            assert sib.node.id == b
            assert sib.files.read("/root/mark") == "made on node a"
            # The restored counter goes on from where it was.
            n1 = int(sib.files.read("/tmp/n"))
            sib.commands.run("sleep 0.3")
            assert int(sib.files.read("/tmp/n")) > n1
        # Sending to its own node is no transfer.
        assert c.send(ck, to=a).checkpoint.id == ck.id
    finally:
        _remove_checkpoints(cluster)


def _digest(c: drums.ray.Cluster, ck: drums.ray.ClusterCheckpoint) -> str:
    d: str | None = ray.get(ck.node.actor.digest_of.remote(ck.id))
    assert d is not None
    return d


def test_fork_spreads_siblings_over_nodes(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    with c.create(node=cluster.nodes["a"].node_id) as sb:
        sb.files.write("/root/mark", "forked")
        ck = sb.checkpoint()
    try:
        sibs = c.fork(ck, count=6)
        try:
            assert sorted(
                sum(1 for s in sibs if s.node.id == n.node_id) for n in cluster.nodes.values()
            ) == [2, 2, 2]
            assert {s.files.read("/root/mark") for s in sibs} == {"forked"}
            # Hygienic siblings, not clones: each its own identity.
            ids = [
                s.commands.run("hostname; cat /etc/machine-id; ip -br addr show eth0").stdout
                for s in sibs
            ]
            assert len(set(ids)) == 6
        finally:
            for s in sibs:
                s.kill()
    finally:
        _remove_checkpoints(cluster)


def test_an_untrusted_nodes_checkpoint_is_refused_and_nothing_kept(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    with c.create(node=cluster.nodes["c"].node_id) as sb:
        ck = sb.checkpoint()
    try:
        with pytest.raises(drums.Untrusted) as ue:
            c.send(ck, to=cluster.nodes["a"].node_id)
        assert ue.value.status == 403
        with _client(cluster, "a") as cl:
            assert cl.checkpoints.list() == []
        # Node b trusts c: the same checkpoint goes there.
        assert c.send(ck, to=cluster.nodes["b"].node_id).moved_bytes > 0
    finally:
        _remove_checkpoints(cluster)


def test_a_checkpoint_a_node_cannot_restore_is_refused(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    # A disk quota node c's 2 GiB store cannot hold.
    with c.create(node=cluster.nodes["a"].node_id, disk="3G") as sb:
        ck = sb.checkpoint()
    try:
        with pytest.raises(drums.InvalidArgument) as ia:
            c.send(ck, to=cluster.nodes["c"].node_id)
        assert "cannot be restored" in ia.value.message or "limits" in ia.value.message
        with _client(cluster, "c") as cl:
            assert cl.checkpoints.list() == []
    finally:
        _remove_checkpoints(cluster)


def test_bytes_that_stop_coming_or_differ_leave_nothing(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    with c.create(node=a.node_id) as sb:
        # Several chunks of archive: a file bigger than three.
        sb.commands.run(f"head -c {3 * drums.ray.CHUNK + 4096} /dev/urandom > /root/big")
        ck = sb.checkpoint()
    try:
        node_a, node_b = c.node(a.node_id), c.node(b.node_id)
        staged: Staged = ray.get(node_a.actor.stage.remote(ck.id))
        assert len(staged.chunks) >= 4

        # The sender vanishes after two chunks: the objects of an owner that
        # died are lost.
        @ray.remote(num_cpus=0)
        class Owner:
            def put(self) -> list[ray.ObjectRef[bytes]]:
                return [ray.put(b"\0" * 1024)]

        # On node a, never on b: a reader on the node that holds an object
        # reads it from the local store without asking its owner, so a dead
        # owner's object stays readable there (CI read one, twice). From b it
        # can only come through the owner, which is gone.
        owner = Owner.options(  # type: ignore[attr-defined]
            scheduling_strategy=NodeAffinitySchedulingStrategy(a.node_id, soft=False)
        ).remote()
        (lost,) = ray.get(owner.put.remote())
        ray.kill(owner)
        # ray.kill returns before the actor is gone: wait until it is.
        for _ in range(200):
            try:
                ray.get(owner.put.remote(), timeout=5)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                break
            time.sleep(0.05)
        broken = Staged(**{**staged.__dict__, "chunks": (*staged.chunks[:2], lost)})
        with pytest.raises(drums.ray.TransferError) as te:
            ray.get(node_b.actor.receive.remote(broken))
        assert "broke off at chunk 3" in te.value.message
        # Bytes that are not what was staged: refused at the end, by digest.
        tampered = Staged(**{**staged.__dict__, "digest": "0" * 64})
        with pytest.raises(drums.ray.TransferError) as te2:
            ray.get(node_b.actor.receive.remote(tampered))
        assert "digest" in te2.value.message
        with _client(cluster, "b") as cl:
            assert cl.checkpoints.list() == []
        # A whole one still goes through.
        assert c.send(ck, to=b.node_id).moved_bytes == staged.size
    finally:
        _remove_checkpoints(cluster)


def test_a_desktop_checkpoint_forks_onto_the_other_nodes(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    a = cluster.nodes["a"].node_id
    others = [cluster.nodes["b"].node_id, cluster.nodes["c"].node_id]
    sb = c.create(node=a, profile="desktop", memory="1G", pids=512, screen="800x600")
    try:
        ck = sb.checkpoint(clean=True)
    finally:
        sb.kill()
    try:
        sibs = c.fork(ck, count=4, nodes=others)
        try:
            assert sorted(s.node.id for s in sibs) == sorted(others * 2)
            for s in sibs:
                # Agent-ready: the restore returned after the guest saw the
                # page drawn and titled; the screen is the desktop's own.
                png = s.screenshot()
                assert png.startswith(b"\x89PNG\r\n\x1a\n")
                assert struct.unpack(">II", png[16:24]) == (800, 600)
                title = s.commands.run("DISPLAY=:0 wmctrl -l").stdout
                assert "Chromium" in title or "Chrome" in title, title
            # The siblings on each node pass drums audit against each other.
            for name in ("b", "c"):
                pair = [s for s in sibs if s.node.id == cluster.nodes[name].node_id]
                with _client(cluster, name) as cl:
                    report = cl.audit(pair[0].id, pair[1].id)
                assert report.passed, report
            # And across nodes: no two share an identity.
            idents = {s.commands.run("hostname; cat /etc/machine-id").stdout for s in sibs}
            assert len(idents) == 4
            # The second fork onto the same nodes moves nothing.
            again = c.send_many(ck, others)
            assert [t.moved_bytes for t in again] == [0, 0]
        finally:
            for s in sibs:
                s.kill()
    finally:
        _remove_checkpoints(cluster)


def test_migration_keeps_a_running_servers_state(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    a, b = cluster.nodes["a"].node_id, cluster.nodes["b"].node_id
    sb = c.create(node=a, name="wanderer")
    try:
        sb.files.write("/root/counter.py", _COUNTER)
        sb.commands.run("nohup python3 /root/counter.py >/dev/null 2>&1 &")
        sb.commands.run("sleep 0.3")
        before = int(sb.files.read("/tmp/n"))
        old_id = sb.id
        t = sb.migrate(to=b)
        assert t.moved_bytes > 0
        # The same handle, now on b, under the same name; the original is gone.
        assert (sb.node.id, sb.name) == (b, "wanderer")
        with _client(cluster, "a") as ca:
            assert drums.Sandbox.list(client=ca) == []
            assert ca.checkpoints.list() == []
        with _client(cluster, "b") as cb:
            assert [s.name for s in drums.Sandbox.list(client=cb)] == ["wanderer"]
            assert cb.checkpoints.list() == []
        assert sb.id != old_id
        # The server's memory came along: its count goes on from there.
        n1 = int(sb.files.read("/tmp/n"))
        assert n1 >= before
        sb.commands.run("sleep 0.3")
        assert int(sb.files.read("/tmp/n")) > n1
        assert "python3 /root/counter.py" in sb.commands.run("ps -eo args").stdout
        with pytest.raises(drums.InvalidArgument):
            sb.migrate(to=b)
    finally:
        sb.kill()


def test_migration_that_fails_leaves_the_original(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    # Node a does not trust c: c's session cannot move to a.
    with c.create(node=cluster.nodes["c"].node_id) as sb:
        sb.files.write("/root/keep", "still here")
        with pytest.raises(drums.Untrusted):
            sb.migrate(to=cluster.nodes["a"].node_id)
        assert sb.node.id == cluster.nodes["c"].node_id
        assert sb.files.read("/root/keep") == "still here"
        with _client(cluster, "c") as cc:
            assert cc.checkpoints.list() == []


@ray.remote(num_cpus=0, resources={"drums_node_b": 0.01})
def _take_on_b(pool: drums.ray.ClusterPool) -> str:
    with pool.take() as sb:
        return sb.node.id


def test_a_cluster_pool_keeps_warm_siblings_on_every_node(cluster: RayCluster) -> None:
    c = drums.ray.Cluster()
    with c.create(node=cluster.nodes["a"].node_id) as sb:
        sb.files.write("/root/mark", "pooled")
        ck = sb.checkpoint()
    try:
        with c.pool(ck, size=1) as pool:
            assert set(pool.pools) == {n.node_id for n in cluster.nodes.values()}
            # Every node's member restored (they fill in the background): a
            # take then has its choice of node.
            deadline = time.monotonic() + 60
            while any(p.ready < 1 for p in pool.info().values()):
                assert time.monotonic() < deadline, pool.info()
                time.sleep(0.1)
            # take() prefers the caller's node: the driver's...
            with pool.take() as first:
                assert first.node.id == ray.get_runtime_context().get_node_id()
                assert first.files.read("/root/mark") == "pooled"
            # ...and a Ray task pinned to node b takes b's.
            assert ray.get(_take_on_b.remote(pool)) == cluster.nodes["b"].node_id
        for name in cluster.nodes:
            with _client(cluster, name) as cl:
                assert cl.pools.list() == []
    finally:
        _remove_checkpoints(cluster)


def test_the_gate_holds_an_answer_until_its_timeout_or_until_it_goes_off(
    cluster: RayCluster,
) -> None:
    import openai

    c = drums.ray.Cluster()
    cluster.llm.script("gated", ["touch /root/x"] * 10)
    with c.create(node=cluster.nodes["a"].node_id) as sb, _client(cluster, "a") as cl:
        local = drums.Sandbox.connect(sb.id, client=cl)
        local.replication.on(timeout=1.0)
        model = openai.OpenAI(base_url=sb.llm_base_url(), api_key="none", max_retries=0)
        try:
            msgs: list[Any] = [{"role": "user", "content": "go"}]
            # No copier: the base version's answer waits the whole timeout.
            model.chat.completions.create(model="gated", messages=msgs)
            sb.commands.run("touch /root/y")
            # The gate goes off while an answer waits: it goes on at once.
            t = threading.Timer(0.3, local.replication.off)
            t.start()
            model.chat.completions.create(model="gated", messages=msgs)
            t.join()
        finally:
            model.close()
        first, second = sb.turns()
        assert (first.replica, second.replica) == ("timed_out", "off")
        assert first.replica_ms >= 1000 > second.replica_ms >= 200
        assert first.version is not None and second.version is not None


def test_a_session_cannot_reach_the_clusters_ports(cluster: RayCluster) -> None:
    """Ray listens on every interface; a session's firewall keeps it from
    Ray's GCS and nodes on the host (its gateway), and the cluster's
    loopback address is the session's own."""
    c = drums.ray.Cluster()
    with c.create(node=cluster.nodes["b"].node_id) as sb:
        assert sb.info.ip is not None
        gateway = sb.info.ip.rsplit(".", 1)[0] + ".1"
        ports = [cluster.gcs_port]
        for node in cluster.nodes.values():
            ports += [node.node_manager_port, node.object_manager_port]
        for host in (gateway, "127.0.0.2"):
            for port in ports:
                probe = (
                    "import socket; s = socket.socket(); s.settimeout(2); "
                    f"s.connect(({host!r}, {port})); print('CONNECTED')"
                )
                r = sb.commands.run(["python3", "-c", probe])
                assert r.exit_code != 0 and "CONNECTED" not in r.stdout, (host, port, r)
