"""Images: pull from a real local registry, import, list, remove (both twins)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import drums
from drums.models import Image, ImageRef
from tests import registry as reg


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[reg.Registry]:
    why = reg.missing()
    if why is not None:
        if os.environ.get("DRUMS_REQUIRE_ROOT_TESTS") == "1":
            pytest.fail(f"{why}. NOT SKIPPED: failing on purpose")
        pytest.skip(f"SKIPPED, NOT PASSED: {why}")
    d = tmp_path / "registry"
    d.mkdir()
    r = reg.Registry(d)
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.mark.anyio
async def test_pull_list_remove(
    async_client: drums.AsyncClient, registry: reg.Registry, tmp_path: Path
) -> None:
    layout = tmp_path / "layout"
    reg.write_busybox_layout(layout, "latest", f"pull {tmp_path}")
    registry.push(layout, "drums/pytest:latest")
    ref = f"{registry.addr}/drums/pytest:latest"
    events: list[dict[str, Any]] = []
    got = await async_client.images.pull(ref, progress=events.append, insecure=True)
    assert isinstance(got, ImageRef)
    assert got.id
    assert ref in got.names
    assert events, "a pull that fetched layers reports progress"
    # Every layer is stored now: the answer is the ImageRef itself. Unused
    # credentials reach drumsd (the registry never asks for them).
    again = await async_client.images.pull(ref, insecure=True, username="nobody", password="secret")
    assert again.id == got.id
    images = await async_client.images.list()
    assert all(isinstance(i, Image) for i in images)
    assert any(i.id == got.id for i in images)
    assert any(i.name == "default" and i.kind == "drums" for i in images)
    removed = await async_client.images.remove(ref)
    assert removed.id == got.id
    with pytest.raises(drums.NotFound):
        await async_client.images.remove(ref)
    with pytest.raises(drums.InvalidArgument):
        await async_client.images.pull("not a reference!", insecure=True)


@pytest.mark.anyio
async def test_import_oci_archive(
    async_client: drums.AsyncClient, registry: reg.Registry, tmp_path: Path
) -> None:
    layout = tmp_path / "layout"
    reg.write_busybox_layout(layout, "v1", f"import {tmp_path}")
    archive = tmp_path / "image.tar"
    reg.to_oci_archive(layout, "v1", archive)
    got = await async_client.images.import_(archive)
    assert got.id is not None
    try:
        assert any(i.id == got.id for i in await async_client.images.list())
    finally:
        await async_client.images.remove(got.id)
    with open(archive, "rb") as f:
        again = await async_client.images.import_(f, name="localhost/imported:1")
    assert again.id is not None
    assert again.names == ("localhost/imported:1",)
    try:
        tagged = await async_client.images.tag("localhost/imported:1", "also:2")
        assert sorted(tagged.names) == ["docker.io/library/also:2", "localhost/imported:1"]
        with pytest.raises(drums.InvalidArgument, match="invalid image name"):
            await async_client.images.tag(again.id, "Not A Name")
        with pytest.raises(drums.NotFound):
            await async_client.images.tag("localhost/nothing:1", "x:1")
    finally:
        await async_client.images.remove(again.id)
    with pytest.raises(drums.InvalidArgument):
        await async_client.images.import_(__file__)  # not an archive
    with pytest.raises(drums.InvalidArgument, match="invalid image name"):
        await async_client.images.import_(archive, name="Bad Name")
