"""Warm pools (both twins). They need drumsd's /v1/pools: against a daemon
without them these tests FAIL, saying so, and never skip."""

from __future__ import annotations

import functools

import pytest

import drums
from drums._backends import AsyncTask

pytestmark = pytest.mark.pool


async def require_pools(client: drums.AsyncClient) -> None:
    try:
        await client.pools.list()
    except drums.NotFound as e:
        pytest.fail(
            f"this drumsd does not serve /v1/pools ({e.message}): the pool tests cannot run "
            "until the daemon has warm pools. NOT SKIPPED: failing on purpose"
        )


@pytest.mark.anyio
async def test_sixteen_concurrent_takers_on_a_pool_of_four(
    async_client: drums.AsyncClient,
) -> None:
    await require_pools(async_client)
    async with await drums.AsyncSandbox.create(client=async_client) as seed:
        await seed.files.write("/root/seed", "warm")
        ck = await seed.checkpoint(name="py-pool-ck")
    taken: list[drums.AsyncSandbox] = []
    try:
        async with drums.AsyncPool(ck, size=4, name="py-pool", client=async_client) as pool:
            assert pool.name == "py-pool"
            assert [p.name for p in await async_client.pools.list()] == ["py-pool"]
            again = await drums.AsyncPool.connect("py-pool", client=async_client)
            assert again.id == pool.id
            assert (await async_client.pools.get(pool.id)).size == 4
            takers = [AsyncTask(functools.partial(pool.take, timeout=120)) for _ in range(16)]
            for t in takers:
                taken.append(await t.join())
            ids = [s.id for s in taken]
            assert len(set(ids)) == 16, f"a member was handed out twice: {ids}"
            for s in taken:
                assert s.info.pool is None  # yours now
                assert s.info.origin == ck.id
            assert await taken[0].files.read("/root/seed") == "warm"
            report = await async_client.audit(taken[0].id, taken[1].id)
            assert report.passed, report
            info = await pool.info()
            assert info.taken >= 16
            members = [
                s
                for s in await drums.AsyncSandbox.list(client=async_client)
                if s.info.pool == pool.id
            ]
        # Leaving the block removed the pool and its members not taken...
        assert await async_client.pools.list() == []
        left = {s.id for s in await drums.AsyncSandbox.list(client=async_client)}
        assert not left & {s.id for s in members}
        # ...and the sessions taken from it stay, ours to kill.
        assert set(ids) <= left
    finally:
        for s in taken:
            await s.kill()
        await ck.remove()


@pytest.mark.anyio
async def test_pool_without_with_is_made_on_first_use(async_client: drums.AsyncClient) -> None:
    await require_pools(async_client)
    async with await drums.AsyncSandbox.create(client=async_client) as seed:
        ck = await seed.checkpoint()
    pool = drums.AsyncPool(ck.id, size=1, client=async_client)
    try:
        with pytest.raises(drums.NotFound):
            _ = pool.id  # nothing made yet
        async with await pool.take(timeout=60) as sb:
            assert (await sb.commands.run("echo pooled")).stdout == "pooled\n"
        assert (await pool.info()).size == 1
        with pytest.raises(drums.NotFound):
            await drums.AsyncPool.connect("no-such-pool", client=async_client)
        with pytest.raises(drums.InvalidArgument):
            await drums.AsyncPool(ck, size=0, client=async_client).create()
    finally:
        assert await pool.remove() is True
        assert await pool.remove() is False
        await ck.remove()
