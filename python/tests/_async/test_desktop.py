"""A desktop session's screen, through OSWorld's port 5000 (both twins)."""

from __future__ import annotations

import struct

import pytest

import drums


@pytest.mark.anyio
async def test_desktop_screenshot_is_a_png(async_client: drums.AsyncClient) -> None:
    async with await drums.AsyncSandbox.create(
        profile="desktop", memory="1G", pids=512, screen="800x600", client=async_client
    ) as sb:
        assert sb.info.profile == "desktop"
        assert sb.osworld_url == f"http://{sb.info.ip}:5000"
        png = await sb.screenshot()
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        width, height = struct.unpack(">II", png[16:24])
        assert (width, height) == (800, 600)


@pytest.mark.anyio
async def test_desktop_needs_its_limits(async_client: drums.AsyncClient) -> None:
    with pytest.raises(drums.InvalidArgument) as ia:
        await drums.AsyncSandbox.create(profile="desktop", memory="128M", client=async_client)
    assert "512" in ia.value.message or "memory" in ia.value.message
    async with await drums.AsyncSandbox.create(network="none", client=async_client) as sb:
        with pytest.raises(drums.InvalidArgument):
            _ = sb.osworld_url
