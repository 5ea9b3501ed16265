"""Events and snapshots to JSON and back, without loss: the wire form for viewers and nodes.

``{"type": "RankExited", "rank": 1, ...}``; enums travel as their values, bytes as base64,
tuples as lists. Decoding is driven by each dataclass's type hints, so a new event needs no
code here, only a place in ``events.Event`` (a round-trip test covers every type).
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import types
import typing
from functools import cache
from typing import Any

from forgelm_tui.engine import events as ev

Wire = dict[str, Any]
T = typing.TypeVar("T")
_TYPES: dict[str, type] = {t.__name__: t for t in (*ev.EVENT_TYPES, ev.RunSnapshot)}


class DecodeError(ValueError):
    """The JSON does not describe an event this version knows."""


def to_wire(obj: Any) -> Wire:
    """An event or snapshot as a JSON-ready dict with its type name."""
    return {"type": type(obj).__name__, **_fields(obj)}


def from_wire(data: Wire) -> Any:
    """The event or snapshot ``to_wire`` made; DecodeError for anything else."""
    try:
        cls = _TYPES[data["type"]]
    except (KeyError, TypeError):
        raise DecodeError(f"not an event: {str(data)[:80]}") from None
    try:
        return _build(cls, data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DecodeError(f"bad {cls.__name__}: {exc}") from None


def encode(obj: Any) -> Wire:
    """Any of the package's frozen facts (a node's outcome, the run's) as a JSON-ready dict."""
    return _fields(obj)


def decode(cls: type[T], data: Wire) -> T:
    """What :func:`encode` made of a ``cls``; DecodeError for anything else."""
    try:
        return typing.cast(T, _build(cls, data))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DecodeError(f"bad {cls.__name__}: {exc}") from None


def _fields(obj: Any) -> Wire:
    return {f.name: _encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _encode(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _fields(value)
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, data: Wire) -> Any:
    hints = _hints(cls)
    kwargs = {f.name: _decode(hints[f.name], data[f.name]) for f in dataclasses.fields(cls)
              if f.name in data or f.default is dataclasses.MISSING}
    return cls(**kwargs)


def _decode(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _decode(inner, value)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        return tuple(_decode(a, v) for a, v in zip(args, value, strict=True))
    if origin is dict:
        _, value_hint = typing.get_args(hint)
        return {str(k): _decode(value_hint, v) for k, v in value.items()}
    if hint is bytes:
        return base64.b64decode(value)
    if hint is float:
        return float(value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if dataclasses.is_dataclass(hint):
        return _build(typing.cast(type, hint), value)
    return value
