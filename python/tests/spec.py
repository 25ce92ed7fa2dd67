"""api/openapi.yaml, read for the tests, and the SDK's map of its operations."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml

SPEC = Path(__file__).resolve().parents[2] / "api/openapi.yaml"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")

# Every operation of the spec, and the SDK callables that perform it: the
# sync one, then its async twin (a dotted path from the `drums` module).
OPERATIONS: dict[str, tuple[str, str]] = {
    "version": ("version", "aio.version"),
    "listImages": ("Images.list", "AsyncImages.list"),
    "pullImage": ("Images.pull", "AsyncImages.pull"),
    "importImage": ("Images.import_", "AsyncImages.import_"),
    "removeImage": ("Images.remove", "AsyncImages.remove"),
    "tagImage": ("Images.tag", "AsyncImages.tag"),
    "listSessions": ("Sandbox.list", "AsyncSandbox.list"),
    "createSession": ("Sandbox.create", "AsyncSandbox.create"),
    "getSession": ("Sandbox.connect", "AsyncSandbox.connect"),
    "removeSession": ("Sandbox.kill", "AsyncSandbox.kill"),
    "sessionStats": ("Sandbox.stats", "AsyncSandbox.stats"),
    "exec": ("Commands.run", "AsyncCommands.run"),
    "downloadFile": ("Files.read", "AsyncFiles.read"),
    "uploadFile": ("Files.write", "AsyncFiles.write"),
    "listDirectory": ("Files.list", "AsyncFiles.list"),
    "forkSession": ("Sandbox.fork", "AsyncSandbox.fork"),
    "beginTurn": ("Turn.begin", "AsyncTurn.begin"),
    "endTurn": ("Turn.end", "AsyncTurn.end"),
    "recoverSession": ("Sandbox.recover", "AsyncSandbox.recover"),
    "listVersions": ("Sandbox.versions", "AsyncSandbox.versions"),
    "listCoordinatedTurns": ("Sandbox.turns", "AsyncSandbox.turns"),
    "replicationOn": ("Replicas.on", "AsyncReplicas.on"),
    "getReplication": ("Replicas.state", "AsyncReplicas.state"),
    "replicationOff": ("Replicas.off", "AsyncReplicas.off"),
    "nextReplica": ("Replicas.next", "AsyncReplicas.next"),
    "ackReplica": ("Replicas.ack", "AsyncReplicas.ack"),
    "rollback": ("Sandbox.rollback", "AsyncSandbox.rollback"),
    "showJob": ("Jobs.get", "AsyncJobs.get"),
    "promoteJob": ("Jobs.promote", "AsyncJobs.promote"),
    "streamTurns": ("Sandbox.inspect", "AsyncSandbox.inspect"),
    "stopInspecting": ("Sandbox.stop_inspecting", "AsyncSandbox.stop_inspecting"),
    "markAgent": ("Sandbox.mark_agent", "AsyncSandbox.mark_agent"),
    "listCheckpoints": ("Checkpoints.list", "AsyncCheckpoints.list"),
    "createCheckpoint": ("Sandbox.checkpoint", "AsyncSandbox.checkpoint"),
    "getCheckpoint": ("Checkpoints.get", "AsyncCheckpoints.get"),
    "removeCheckpoint": ("Checkpoint.remove", "AsyncCheckpoint.remove"),
    "restoreCheckpoint": ("Checkpoint.restore", "AsyncCheckpoint.restore"),
    "exportCheckpoint": ("Checkpoint.export", "AsyncCheckpoint.export"),
    "importCheckpoint": ("Checkpoints.import_", "AsyncCheckpoints.import_"),
    "listPools": ("Pools.list", "AsyncPools.list"),
    "createPool": ("Pool.create", "AsyncPool.create"),
    "getPool": ("Pool.info", "AsyncPool.info"),
    "removePool": ("Pool.remove", "AsyncPool.remove"),
    "takeFromPool": ("Pool.take", "AsyncPool.take"),
    "hostKey": ("host_key", "aio.host_key"),
    "capacity": ("capacity", "aio.capacity"),
    "audit": ("audit", "aio.audit"),
    "setFault": ("Debug.set_fault", "AsyncDebug.set_fault"),
    "openapi": ("openapi", "aio.openapi"),
}


@functools.cache
def load() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    return doc


def operations() -> list[tuple[str, str, str]]:
    """(operationId, METHOD, path template) of every operation."""
    out = []
    for path, item in load()["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                out.append((op["operationId"], method.upper(), path))
    return out


@functools.cache
def _matchers() -> list[tuple[re.Pattern[str], str, str]]:
    ms = []
    for op, method, path in operations():
        rx = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path))
        ms.append((re.compile(f"^{rx}$"), method, op))
    # Literal routes before templated ones (/v1/images/pull before {image}).
    ms.sort(key=lambda m: m[0].pattern.count("[^/]+"))
    return ms


def operation_of(method: str, path: str) -> str | None:
    """The operationId a request is, or None."""
    for rx, m, op in _matchers():
        if m == method and rx.match(path):
            return op
    return None
