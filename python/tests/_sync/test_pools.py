# GENERATED from tests/_async/test_pools.py by scripts/unasync.py: do not edit.
"""Warm pools (both twins). They need drumsd's /v1/pools: against a daemon
without them these tests FAIL, saying so, and never skip."""

from __future__ import annotations

import functools

import pytest

import drums
from drums._backends import Task

pytestmark = pytest.mark.pool


def require_pools(client: drums.Client) -> None:
    try:
        client.pools.list()
    except drums.NotFound as e:
        pytest.fail(
            f"this drumsd does not serve /v1/pools ({e.message}): the pool tests cannot run "
            "until the daemon has warm pools. NOT SKIPPED: failing on purpose"
        )


def test_sixteen_concurrent_takers_on_a_pool_of_four(
    client: drums.Client,
) -> None:
    require_pools(client)
    with drums.Sandbox.create(client=client) as seed:
        seed.files.write("/root/seed", "warm")
        ck = seed.checkpoint(name="py-pool-ck")
    taken: list[drums.Sandbox] = []
    try:
        with drums.Pool(ck, size=4, name="py-pool", client=client) as pool:
            assert pool.name == "py-pool"
            assert [p.name for p in client.pools.list()] == ["py-pool"]
            again = drums.Pool.connect("py-pool", client=client)
            assert again.id == pool.id
            assert (client.pools.get(pool.id)).size == 4
            takers = [Task(functools.partial(pool.take, timeout=120)) for _ in range(16)]
            for t in takers:
                taken.append(t.join())
            ids = [s.id for s in taken]
            assert len(set(ids)) == 16, f"a member was handed out twice: {ids}"
            for s in taken:
                assert s.info.pool is None  # yours now
                assert s.info.origin == ck.id
            assert taken[0].files.read("/root/seed") == "warm"
            report = client.audit(taken[0].id, taken[1].id)
            assert report.passed, report
            info = pool.info()
            assert info.taken >= 16
            members = [
                s
                for s in drums.Sandbox.list(client=client)
                if s.info.pool == pool.id
            ]
        # Leaving the block removed the pool and its members not taken...
        assert client.pools.list() == []
        left = {s.id for s in drums.Sandbox.list(client=client)}
        assert not left & {s.id for s in members}
        # ...and the sessions taken from it stay, ours to kill.
        assert set(ids) <= left
    finally:
        for s in taken:
            s.kill()
        ck.remove()


def test_pool_without_with_is_made_on_first_use(client: drums.Client) -> None:
    require_pools(client)
    with drums.Sandbox.create(client=client) as seed:
        ck = seed.checkpoint()
    pool = drums.Pool(ck.id, size=1, client=client)
    try:
        with pytest.raises(drums.NotFound):
            _ = pool.id  # nothing made yet
        with pool.take(timeout=60) as sb:
            assert (sb.commands.run("echo pooled")).stdout == "pooled\n"
        assert (pool.info()).size == 1
        with pytest.raises(drums.NotFound):
            drums.Pool.connect("no-such-pool", client=client)
        with pytest.raises(drums.InvalidArgument):
            drums.Pool(ck, size=0, client=client).create()
    finally:
        assert pool.remove() is True
        assert pool.remove() is False
        ck.remove()
