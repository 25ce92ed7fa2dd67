# GENERATED from src/drums/_async/_images.py by scripts/unasync.py: do not edit.
"""Images: list, pull from a registry, import an archive, tag, remove."""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import httpx

from drums import _parse
from drums._sync._client import seg
from drums._sync._files import file_chunks
from drums._backends import call_handler
from drums._errors import DaemonUnavailable, DrumsError
from drums.models import Image, ImageList, ImageRef

if TYPE_CHECKING:
    from drums._sync._client import Client

ProgressHandler = Callable[[dict[str, Any]], object]
"""Called with each progress event of a pull, as drumsd sends it (a JSON object)."""


class Images:
    """Images of one daemon (`client.images`, `drums.images`)."""

    def __init__(self, client: Client | None = None) -> None:
        self._c = client

    @property
    def _client(self) -> Client:
        if self._c is not None:
            return self._c
        from drums._default import default_client

        return default_client()

    def list(self) -> builtins.list[Image]:
        """Every image in the store."""
        il = self._client._get_json(ImageList, "/v1/images")
        return builtins.list(il.images)

    def pull(
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
        with self._client._stream("POST", "/v1/images/pull", json=body) as r:
            if not r.headers.get("content-type", "").startswith("application/x-ndjson"):
                # Every layer was stored already: the answer is the ImageRef.
                return _parse.parse(ImageRef, json.loads(r.read()))
            try:
                for line in r.iter_lines():
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
                        call_handler(progress, ev)
            except httpx.HTTPError as e:
                raise DaemonUnavailable(f"the pull of {ref} broke off: {e}") from e
        raise DaemonUnavailable(f"the pull of {ref} ended without its last event")

    def remove(self, ref: str) -> ImageRef:
        """Remove an image by reference or id (with the layers no other image
        uses); a reference of an image with others only goes from it."""
        r = self._client._request("DELETE", f"/v1/images/{seg(ref)}")
        return _parse.parse(ImageRef, json.loads(r.content))

    def tag(self, image: str, name: str) -> ImageRef:
        """Name an OCI image (by reference or id) `name` too, as `podman tag`
        does; the name moves off any image that had it."""
        return self._client._call_json(
            ImageRef, "POST", f"/v1/images/{seg(image)}/tag", body={"name": name}
        )

    def import_(
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
                return c._call_json(
                    ImageRef,
                    "POST",
                    "/v1/images/import",
                    content=file_chunks(f),
                    headers=headers,
                    params=params,
                )
        return c._call_json(
            ImageRef,
            "POST",
            "/v1/images/import",
            content=file_chunks(src),
            headers=headers,
            params=params,
        )
