# GENERATED from src/drums/_async/_jobs.py by scripts/unasync.py: do not edit.
"""Checkpoint jobs of the engine (docs/engine.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drums._sync._client import seg
from drums.models import Job

if TYPE_CHECKING:
    from drums._sync._client import Client


class Jobs:
    """Checkpoint jobs (`client.jobs`, `drums.jobs`)."""

    def __init__(self, client: Client | None = None) -> None:
        self._c = client

    @property
    def _client(self) -> Client:
        if self._c is not None:
            return self._c
        from drums._default import default_client

        return default_client()

    def get(self, id: str, *, wait: bool = False) -> Job:
        """Job `id`; with `wait`, once it finished (done or failed)."""
        params = {"wait": "true"} if wait else None
        return self._client._call_json(
            Job, "GET", f"/v1/jobs/{seg(id)}", params=params, timeout=None if wait else ...
        )

    def promote(self, id: str) -> Job:
        """Move queued job `id` to the high-priority queue (its caller now waits for it)."""
        return self._client._call_json(Job, "POST", f"/v1/jobs/{seg(id)}/promote")
