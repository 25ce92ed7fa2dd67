"""JSON answers into the dataclasses of `drums.models`, checked on the way in.

A hand-written reader rather than a validation library: the only runtime
dependency is httpx. It checks each value's JSON type against the field's
annotation, so a model's types hold for whoever uses it; a mismatch is a
`DrumsError` naming the field (drumsd and the spec disagree).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

from drums._errors import DrumsError

T = TypeVar("T")

_HINTS: dict[type[Any], list[tuple[str, str, Any, bool]]] = {}


def json_name(field_name: str) -> str:
    """The JSON name of a model's field (`class_` is `class`)."""
    return field_name[:-1] if field_name.endswith("_") else field_name


def _fields(cls: type[Any]) -> list[tuple[str, str, Any, bool]]:
    cached = _HINTS.get(cls)
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = [
            (
                f.name,
                json_name(f.name),
                hints[f.name],
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
        ]
        _HINTS[cls] = cached
    return cached


def parse(cls: type[T], value: object, where: str = "") -> T:
    """`value` (decoded JSON) as an instance of the model `cls`."""
    where = where or cls.__name__
    if not isinstance(value, dict):
        raise DrumsError(
            f"{where}: expected an object, got {type(value).__name__}", kind="protocol"
        )
    kwargs: dict[str, Any] = {}
    for name, key, hint, required in _fields(cls):
        if key in value:
            kwargs[name] = _convert(hint, value[key], f"{where}.{key}")
        elif required:
            raise DrumsError(f"{where}: the answer lacks required field {key!r}", kind="protocol")
    return cls(**kwargs)


def _convert(hint: Any, v: object, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is types.UnionType or origin is typing.Union:
        args = typing.get_args(hint)
        if v is None:
            if type(None) in args:
                return None
            raise DrumsError(f"{where}: null where a value is required", kind="protocol")
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, v, where)
    if origin is tuple:
        if not isinstance(v, list):
            raise DrumsError(f"{where}: expected an array", kind="protocol")
        (item, _ellipsis) = typing.get_args(hint)
        return tuple(_convert(item, x, f"{where}[{i}]") for i, x in enumerate(v))
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return parse(hint, v, where)
    if hint is bool:
        if isinstance(v, bool):
            return v
    elif hint is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    elif hint is float:
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    elif hint is str:
        if isinstance(v, str):
            return v
    else:  # pragma: no cover - a model with a type this reader does not know
        raise TypeError(f"{where}: unsupported annotation {hint!r}")
    raise DrumsError(f"{where}: expected {hint.__name__}, got {type(v).__name__}", kind="protocol")
