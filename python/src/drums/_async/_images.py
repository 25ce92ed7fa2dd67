"""Images: list, pull from a registry, import an archive, tag, remove."""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import httpx

from drums import _parse
from drums._async._client import seg
from drums._async._files import file_chunks
from drums._backends import async_call_handler
from drums._errors import DaemonUnavailable, DrumsError
from drums.models import Image, ImageList, ImageRef

if TYPE_CHECKING:
    from drums._async._client import AsyncClient

ProgressHandler = Callable[[dict[str, Any]], object]
"""Called with each progress event of a pull, as drumsd sends it (a JSON object)."""


class AsyncImages:
    """Images of one daemon (`client.images`, `drums.images`)."""

    def __init__(self, client: AsyncClient | None = None) -> None:
        self._c = client

    @property
    def _client(self) -> AsyncClient:
        if self._c is not None:
            return self._c
        from drums._default import async_default_client

        return async_default_client()

    async def list(self) -> builtins.list[Image]:
        """Every image in the store."""
        il = await self._client._get_json(ImageList, "/v1/images")
        return builtins.list(il.images)

    async def pull(
        self,
        ref: str,
        *,
        progress: ProgressHandler | None = None,
        insecure: bool = False,
        username: str | None = None,
        password: str | None = None,
    ) -> ImageRef:
        """Pull an OCI image (linux/amd64) into the store, every digest verified.

        Args:
            ref: an image reference ("registry:5000/name:tag").
            progress: called with each progress event.
            insecure: plain HTTP to the registry.
            username: basic-auth user (with `password`).
            password: basic-auth password.
        """
        body: dict[str, Any] = {"reference": ref, "insecure": insecure}
        if username is not None:
            body["username"] = username
        if password is not None:
            body["password"] = password
        async with self._client._stream("POST", "/v1/images/pull", json=body) as r:
            if not r.headers.get("content-type", "").startswith("application/x-ndjson"):
                # Every layer was stored already: the answer is the ImageRef.
                return _parse.parse(ImageRef, json.loads(await r.aread()))
            try:
                async for line in r.aiter_lines():
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    if not isinstance(ev, dict):
                        raise DrumsError("a pull event that is not an object", kind="protocol")
                    if ev.get("event") == "done":
                        return _parse.parse(ImageRef, ev, "pull's done event")
                    if ev.get("event") == "error":
                        raise DrumsError(str(ev.get("message", "")), kind="pull_failed")
                    if progress is not None:
                        await async_call_handler(progress, ev)
            except httpx.HTTPError as e:
                raise DaemonUnavailable(f"the pull of {ref} broke off: {e}") from e
        raise DaemonUnavailable(f"the pull of {ref} ended without its last event")

    async def remove(self, ref: str) -> ImageRef:
        """Remove an image by reference or id (with the layers no other image
        uses); a reference of an image with others only goes from it."""
        r = await self._client._request("DELETE", f"/v1/images/{seg(ref)}")
        return _parse.parse(ImageRef, json.loads(r.content))

    async def tag(self, image: str, name: str) -> ImageRef:
        """Name an OCI image (by reference or id) `name` too, as `podman tag`
        does; the name moves off any image that had it."""
        return await self._client._call_json(
            ImageRef, "POST", f"/v1/images/{seg(image)}/tag", body={"name": name}
        )

    async def import_(
        self, src: str | os.PathLike[str] | IO[bytes], *, name: str | None = None
    ) -> ImageRef:
        """Import a `docker save` archive or an oci-archive, streamed from a
        path or a binary file object; `name` names the image instead of the
        archive's own name (`podman load`'s tag)."""
        c = self._client
        headers = {"content-type": "application/x-tar"}
        params = {"name": name} if name is not None else None
        if isinstance(src, str | os.PathLike):
            with open(src, "rb") as f:
                return await c._call_json(
                    ImageRef,
                    "POST",
                    "/v1/images/import",
                    content=file_chunks(f),
                    headers=headers,
                    params=params,
                )
        return await c._call_json(
            ImageRef,
            "POST",
            "/v1/images/import",
            content=file_chunks(src),
            headers=headers,
            params=params,
        )
