"""The few concurrency primitives whose sync and async forms differ in more
than `async`/`await`, written by hand in both forms.

`scripts/unasync.py` turns the async code under `drums/_async/` into the sync
code under `drums/_sync/`; these names are in its table (`AsyncTask` ->
`Task`, `async_sleep` -> `sleep`, ...). The async twin runs on asyncio (the
event loop httpx's async transport uses by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

import httpx

T = TypeVar("T")


async def async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


async def async_call_handler(handler: Callable[[T], object], value: T) -> None:
    """Call an output handler; the async twin also takes coroutine functions."""
    out = handler(value)
    if inspect.isawaitable(out):
        await out


def call_handler(handler: Callable[[T], object], value: T) -> None:
    handler(value)


class AsyncTask(Generic[T]):
    """A coroutine running beside the caller (an asyncio task)."""

    def __init__(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> None:
        self._task: asyncio.Task[T] = asyncio.get_running_loop().create_task(fn())

    async def join(self) -> T:
        return await asyncio.shield(self._task)

    def done(self) -> bool:
        return self._task.done()


class Task(Generic[T]):
    """A function running beside the caller (a daemon thread, so that a
    forgotten handle never keeps the interpreter alive)."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._result: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._result = fn()
        except BaseException as e:
            self._error = e

    def join(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def done(self) -> bool:
        return not self._thread.is_alive()


class AsyncLock:
    """A lock for the async twin (created lazily: an asyncio.Lock binds to a loop)."""

    def __init__(self) -> None:
        self._lock: asyncio.Lock | None = None

    async def __aenter__(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        await self._lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        assert self._lock is not None
        self._lock.release()


class Lock:
    """A lock for the sync twin."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def abort_response(r: httpx.Response) -> None:
    """Cut a streaming response's connection now, from any thread or task: a
    shutdown wakes a reader blocked on the socket (a close would not), and the
    peer sees the connection end (an exec's command is then killed)."""
    ns = r.extensions.get("network_stream")
    sock = ns.get_extra_info("socket") if ns is not None else None
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
