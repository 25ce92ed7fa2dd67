"""The SDK against api/openapi.yaml: every operation has an SDK method, and
every schema the SDK returns is a model with the schema's fields (names,
required or not, nullable or not, and types). No daemon needed."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any

import pytest

import drums
import drums.aio
from drums import models as m
from drums._parse import json_name
from tests import spec

MODELS: dict[str, type[Any]] = {
    name: getattr(m, name)
    for name in [
        "Version",
        "HostKey",
        "Capacity",
        "Replication",
        "ReplicaVersion",
        "Limits",
        "Session",
        "SessionStats",
        "SessionList",
        "Image",
        "ImageRef",
        "ImageList",
        "TurnBegun",
        "TurnEffects",
        "TurnCheckpoint",
        "ArtifactCost",
        "SessionVersion",
        "SessionVersions",
        "CoordinatedTurns",
        "CoordinatedTurn",
        "Job",
        "AgentMarked",
        "Written",
        "DirListing",
        "Checkpoint",
        "CheckpointList",
        "RestoreResult",
        "AuditCheck",
        "AuditReport",
        "Pool",
        "PoolList",
    ]
}

# Inline objects of the spec that the SDK returns as models of their own.
INLINE: dict[tuple[str, ...], type[Any]] = {
    ("TurnEffects", "files"): m.FileEffect,
    ("TurnEffects", "processes"): m.ProcessEffect,
    ("TurnEffects", "dirtied"): m.Dirtied,
    ("DirListing", "entries"): m.DirEntry,
    ("ExecFrame", "exit"): m.ExitStatus,
}

# Schemas no SDK call returns as data, and why.
NOT_RETURNED = {
    "ErrorBody": "raised as a DrumsError subclass carrying kind and message",
    "ExecFrame": "read by commands.run into a CommandResult; its exit object is ExitStatus",
    "CreateSession": "a request: Sandbox.create's arguments",
    "DesktopOptions": "a request: Sandbox.create's desktop_url and screen",
    "PullRequest": "a request: images.pull's arguments",
    "TagImage": "a request: images.tag's name",
    "EndTurn": "a request: turn.end's arguments",
    "Rollback": "a request: rollback's argument",
    "ReplicationRequest": "a request: replication.on's timeout",
    "MarkAgent": "a request: mark_agent's argument",
    "ExecRequest": "a request: commands.run's and commands.detach's arguments",
    "CreateCheckpoint": "a request: checkpoint's arguments",
    "RestoreRequest": "a request: Checkpoint.restore's arguments",
    "ForkRequest": "a request: fork's arguments",
    "CreatePool": "a request: Pool's arguments",
    "TakeRequest": "a request: Pool.take's argument",
    "Fault": "a request: debug.set_fault's arguments",
}


def resolve(dotted: str) -> Any:
    obj: Any = drums
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_every_operation_has_an_sdk_method_in_both_twins() -> None:
    ops = {op for op, _, _ in spec.operations()}
    assert ops - spec.OPERATIONS.keys() == set(), "operations of the spec without an SDK method"
    assert spec.OPERATIONS.keys() - ops == set(), "mapped operations the spec no longer has"
    for op, paths in spec.OPERATIONS.items():
        for dotted in paths:
            assert not any(p.startswith("_") for p in dotted.split(".")), f"{op}: {dotted}"
            target = resolve(dotted)
            assert callable(target), f"{op}: {dotted} is not callable"
            assert target.__doc__, f"{op}: {dotted} has no docstring"
        sync, asyn = (resolve(p) for p in paths)
        # The twins take the same arguments.
        assert list(inspect.signature(sync).parameters) == list(
            inspect.signature(asyn).parameters
        ), op


def test_every_public_name_is_documented() -> None:
    for name in drums.__all__:
        obj = getattr(drums, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"drums.{name} has no docstring"


def test_every_schema_is_a_model_or_said_why_not() -> None:
    schemas = set(spec.load()["components"]["schemas"])
    assert MODELS.keys() & NOT_RETURNED.keys() == set()
    assert schemas - MODELS.keys() - NOT_RETURNED.keys() == set(), "schemas no model covers"
    assert (MODELS.keys() | NOT_RETURNED.keys()) - schemas == set(), "models of no schema"
    assert set(m.__all__) == {c.__name__ for c in [*MODELS.values(), *INLINE.values()]}


def _schema(path: tuple[str, ...]) -> dict[str, Any]:
    s: dict[str, Any] = spec.load()["components"]["schemas"][path[0]]
    for prop in path[1:]:
        if "oneOf" in s:
            s = next(o for o in s["oneOf"] if prop in o.get("properties", {}))
        s = s["properties"][prop]
        if s.get("type") == "array":
            s = s["items"]
    return s


def _cases() -> list[tuple[tuple[str, ...], type[Any]]]:
    return [((k,), v) for k, v in MODELS.items()] + list(INLINE.items())


def _type_ok(hint: Any, prop: dict[str, Any]) -> bool:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        (hint,) = [a for a in args if a is not type(None)]
        args = typing.get_args(hint)
    if "allOf" in prop:
        prop = prop["allOf"][0]
    if "$ref" in prop:
        return bool(MODELS.get(prop["$ref"].rsplit("/", 1)[1]) is hint)
    t = str(prop.get("type"))
    if t == "array":
        return typing.get_origin(hint) is tuple and _type_ok(args[0], prop["items"])
    if t == "object":
        return dataclasses.is_dataclass(hint)
    return {"string": str, "integer": int, "number": float, "boolean": bool}.get(t) is hint


@pytest.mark.parametrize(("path", "model"), _cases(), ids=lambda x: getattr(x, "__name__", x))
def test_model_matches_its_schema(path: tuple[str, ...], model: type[Any]) -> None:
    schema = _schema(path)
    props: dict[str, Any] = schema["properties"]
    required = set(schema.get("required", []))
    hints = typing.get_type_hints(model)
    fields = {json_name(f.name): f for f in dataclasses.fields(model)}
    assert set(fields) == set(props), f"{model.__name__}: fields differ from the schema's"
    for name, f in fields.items():
        has_default = (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        assert has_default == (name not in required), (
            f"{model.__name__}.{name}: required in the spec: {name in required}"
        )
        prop = props[name]
        admits_none = type(None) in typing.get_args(hints[f.name])
        nullable = bool(prop.get("nullable"))
        if admits_none and not nullable:
            # Only an optional field may use None for "absent", and says so.
            assert name not in required and f.metadata.get("nullable") is False, (
                f"{model.__name__}.{name}: None but not nullable in the spec"
            )
        else:
            assert admits_none == nullable, f"{model.__name__}.{name}: nullable is {nullable}"
        assert _type_ok(hints[f.name], prop), (
            f"{model.__name__}.{name}: {hints[f.name]} is not the spec's {prop}"
        )
    assert dataclasses.is_dataclass(model)
    assert model.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_async_module_helpers_mirror_the_sync_ones() -> None:
    for name in ("version", "host_key", "capacity", "audit", "openapi"):
        assert inspect.iscoroutinefunction(getattr(drums.aio, name))
        assert callable(getattr(drums, name))
    for ns in ("checkpoints", "images", "jobs", "pools", "debug"):
        sync, asyn = getattr(drums, ns), getattr(drums.aio, ns)
        pub = {n for n in dir(sync) if not n.startswith("_")}
        assert pub == {n for n in dir(asyn) if not n.startswith("_")}, ns
