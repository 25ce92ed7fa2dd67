"""The async twin, written by hand; `drums/_sync/` is generated from it."""

from drums._async._checkpoints import AsyncCheckpoint, AsyncCheckpoints
from drums._async._client import AsyncClient, AsyncDebug
from drums._async._commands import AsyncCommandHandle, AsyncCommands
from drums._async._files import AsyncFiles, AsyncFileStream
from drums._async._images import AsyncImages
from drums._async._jobs import AsyncJobs
from drums._async._pools import AsyncPool, AsyncPools
from drums._async._sandbox import (
    AsyncReplicas,
    AsyncSandbox,
    AsyncSandboxes,
    AsyncTurn,
    AsyncTurnStream,
)

__all__ = [
    "AsyncCheckpoint",
    "AsyncCheckpoints",
    "AsyncClient",
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncDebug",
    "AsyncFileStream",
    "AsyncFiles",
    "AsyncImages",
    "AsyncJobs",
    "AsyncPool",
    "AsyncPools",
    "AsyncReplicas",
    "AsyncSandbox",
    "AsyncSandboxes",
    "AsyncTurn",
    "AsyncTurnStream",
]
