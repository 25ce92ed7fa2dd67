"""The module-level helpers of `drums`, for async code: each uses the running
event loop's default `AsyncClient`.

    from drums import aio

    cks = await aio.checkpoints.list()
"""

from __future__ import annotations

from drums._async import (
    AsyncCheckpoints,
    AsyncDebug,
    AsyncImages,
    AsyncJobs,
    AsyncPools,
    AsyncSandbox,
)
from drums._default import async_default_client
from drums.models import AuditReport, Capacity, HostKey, Version

__all__ = [
    "audit",
    "capacity",
    "checkpoints",
    "debug",
    "host_key",
    "images",
    "jobs",
    "openapi",
    "pools",
    "version",
]

checkpoints: AsyncCheckpoints = AsyncCheckpoints()
"""Checkpoints of the default daemon."""
images: AsyncImages = AsyncImages()
"""Images of the default daemon."""
jobs: AsyncJobs = AsyncJobs()
"""Checkpoint jobs of the default daemon."""
pools: AsyncPools = AsyncPools()
"""Warm pools of the default daemon."""
debug: AsyncDebug = AsyncDebug()
"""Test-only calls of the default daemon."""


async def version() -> Version:
    """The default daemon's version."""
    return await async_default_client().version()


async def host_key() -> HostKey:
    """The public key the default daemon's host signs archives with."""
    return await async_default_client().host_key()


async def capacity() -> Capacity:
    """What the default daemon's host holds and may still take."""
    return await async_default_client().capacity()


async def audit(a: str | AsyncSandbox, b: str | AsyncSandbox) -> AuditReport:
    """Isolation and clone checks between two sessions."""
    return await async_default_client().audit(
        a.id if isinstance(a, AsyncSandbox) else a, b.id if isinstance(b, AsyncSandbox) else b
    )


async def openapi() -> str:
    """The API document the default daemon serves (YAML text)."""
    return await async_default_client().openapi()
