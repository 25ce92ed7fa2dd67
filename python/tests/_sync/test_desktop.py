# GENERATED from tests/_async/test_desktop.py by scripts/unasync.py: do not edit.
"""A desktop session's screen, through OSWorld's port 5000 (both twins)."""

from __future__ import annotations

import struct

import pytest

import drums


def test_desktop_screenshot_is_a_png(client: drums.Client) -> None:
    with drums.Sandbox.create(
        profile="desktop", memory="1G", pids=512, screen="800x600", client=client
    ) as sb:
        assert sb.info.profile == "desktop"
        assert sb.osworld_url == f"http://{sb.info.ip}:5000"
        png = sb.screenshot()
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        width, height = struct.unpack(">II", png[16:24])
        assert (width, height) == (800, 600)


def test_desktop_needs_its_limits(client: drums.Client) -> None:
    with pytest.raises(drums.InvalidArgument) as ia:
        drums.Sandbox.create(profile="desktop", memory="128M", client=client)
    assert "512" in ia.value.message or "memory" in ia.value.message
    with drums.Sandbox.create(network="none", client=client) as sb:
        with pytest.raises(drums.InvalidArgument):
            _ = sb.osworld_url
