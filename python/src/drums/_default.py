"""The client the module-level helpers use when none is passed.

Made on first use from the environment (`DRUMS_SOCKET`, `DRUMS_STATE_DIR`,
`DRUMS_NO_AUTOSTART`). The async one is made once per event loop: an httpx
connection belongs to the loop that opened it.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drums._async._client import AsyncClient
    from drums._sync._client import Client

_lock = threading.Lock()
_sync: Client | None = None
_async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient] = (
    weakref.WeakKeyDictionary()
)


def default_client() -> Client:
    """The process's default `Client`."""
    global _sync
    with _lock:
        if _sync is None:
            from drums._sync._client import Client

            _sync = Client()
        return _sync


def async_default_client() -> AsyncClient:
    """The running event loop's default `AsyncClient`."""
    loop = asyncio.get_running_loop()
    with _lock:
        c = _async.get(loop)
        if c is None:
            from drums._async._client import AsyncClient

            c = _async[loop] = AsyncClient()
        return c


def set_default_client(client: Client | None) -> None:
    """Make `client` the default of the module-level helpers (None: back to
    one made from the environment on next use)."""
    global _sync
    with _lock:
        _sync = client
