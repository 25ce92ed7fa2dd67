# GENERATED from src/drums/_async/__init__.py by scripts/unasync.py: do not edit.
"""The async twin, written by hand; `drums/_sync/` is generated from it."""

from drums._sync._checkpoints import Checkpoint, Checkpoints
from drums._sync._client import Client, Debug
from drums._sync._commands import CommandHandle, Commands
from drums._sync._files import Files, FileStream
from drums._sync._images import Images
from drums._sync._jobs import Jobs
from drums._sync._pools import Pool, Pools
from drums._sync._sandbox import (
    Replicas,
    Sandbox,
    Sandboxes,
    Turn,
    TurnStream,
)

__all__ = [
    "Checkpoint",
    "Checkpoints",
    "Client",
    "CommandHandle",
    "Commands",
    "Debug",
    "FileStream",
    "Files",
    "Images",
    "Jobs",
    "Pool",
    "Pools",
    "Replicas",
    "Sandbox",
    "Sandboxes",
    "Turn",
    "TurnStream",
]
