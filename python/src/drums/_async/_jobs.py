"""Checkpoint jobs of the engine (docs/engine.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drums._async._client import seg
from drums.models import Job

if TYPE_CHECKING:
    from drums._async._client import AsyncClient


class AsyncJobs:
    """Checkpoint jobs (`client.jobs`, `drums.jobs`)."""

    def __init__(self, client: AsyncClient | None = None) -> None:
        self._c = client

    @property
    def _client(self) -> AsyncClient:
        if self._c is not None:
            return self._c
        from drums._default import async_default_client

        return async_default_client()

    async def get(self, id: str, *, wait: bool = False) -> Job:
        """Job `id`; with `wait`, once it finished (done or failed)."""
        params = {"wait": "true"} if wait else None
        return await self._client._call_json(
            Job, "GET", f"/v1/jobs/{seg(id)}", params=params, timeout=None if wait else ...
        )

    async def promote(self, id: str) -> Job:
        """Move queued job `id` to the high-priority queue (its caller now waits for it)."""
        return await self._client._call_json(Job, "POST", f"/v1/jobs/{seg(id)}/promote")
