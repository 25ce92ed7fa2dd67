"""Waiting for an actor's answer, in each twin: `await` in the async one,
`ray.get` in the sync one (scripts/unasync.py turns `async_resolve` into
`resolve`). A drums error raised on the node arrives as itself, with the
server's message, kind and status, not wrapped in Ray's task error."""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from drums._errors import DrumsError
from drums.ray._errors import NodeLost


def _translate(e: ray.exceptions.RayError) -> BaseException:
    if isinstance(e, ray.exceptions.RayTaskError) and isinstance(e.cause, DrumsError):
        return e.cause
    if isinstance(e, ray.exceptions.ActorDiedError | ray.exceptions.ActorUnavailableError):
        return NodeLost(f"the drums node is gone: {e}", kind="node_lost")
    return e


def _late(timeout: float | None) -> DrumsError:
    return DrumsError(f"the drums node did not answer within {timeout} s", kind="timeout")


async def async_resolve(ref: ray.ObjectRef[Any], *, timeout: float | None = None) -> Any:
    """The answer of an actor call (within `timeout` seconds, if given)."""
    try:
        return await asyncio.wait_for(_awaited(ref), timeout)
    except TimeoutError as e:
        raise _late(timeout) from e
    except ray.exceptions.RayError as e:
        raise _translate(e) from e


async def _awaited(ref: ray.ObjectRef[Any]) -> Any:
    return await ref


def resolve(ref: ray.ObjectRef[Any], *, timeout: float | None = None) -> Any:
    """The answer of an actor call (within `timeout` seconds, if given)."""
    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError as e:
        raise _late(timeout) from e
    except ray.exceptions.RayError as e:
        raise _translate(e) from e
