"""Structs as msgpack arrays: each frozen dataclass goes on the wire as the array of its fields in
declaration order, a nested struct as the array of its own. shared/messages.py declares the
types and wraps them in its versioned envelope (``encode``, ``decode``); this is the machinery."""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from typing import Any

import msgpack


class WireError(ValueError):
    """A message that cannot be decoded: wrong version, unknown type or wrong shape."""


def _converters(tp: Any) -> tuple[Any, Any]:
    """(to_wire, from_wire) for one annotated field type; None means pass through."""
    if dataclasses.is_dataclass(tp):
        return struct_to_wire, lambda v, tp=tp: struct_from_wire(tp, v)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1:
            enc, dec = _converters(inner[0])
            if enc is None:
                return None, None
            return (lambda v: None if v is None else enc(v)), (lambda v: None if v is None else dec(v))
        return None, None
    if origin is list:
        (item,) = typing.get_args(tp)
        enc, dec = _converters(item)
        if enc is None:
            return None, None
        return (lambda v: [enc(x) for x in v]), (lambda v: [dec(x) for x in v])
    return None, None


_FIELDS: dict[type, list[tuple[str, Any, Any]]] = {}


def _fields(cls: type) -> list[tuple[str, Any, Any]]:
    spec = _FIELDS.get(cls)
    if spec is None:
        hints = typing.get_type_hints(cls)
        spec = [(f.name, *_converters(hints[f.name])) for f in dataclasses.fields(cls)]
        _FIELDS[cls] = spec
    return spec


_PLANS: dict[type, tuple[Any, bool]] = {}


def _plan(cls: type) -> tuple[Any, bool]:
    """(a getter of every field's value as a tuple, in order; whether every field goes on the
    wire as it is). A status lists thousands of requests and a token batch one item per
    request, so the flat structs skip the per-field loop both ways."""
    plan = _PLANS.get(cls)
    if plan is None:
        spec = _fields(cls)
        names = [name for name, _, _ in spec]
        getter = operator.attrgetter(*names) if len(names) > 1 else (lambda obj, n=names[0]: (getattr(obj, n),))
        plan = (getter, all(enc is None for _, enc, _ in spec))
        _PLANS[cls] = plan
    return plan


def struct_to_wire(obj: Any) -> Any:
    """The struct's fields in declaration order (a tuple or a list; msgpack writes both as an array)."""
    getter, flat = _plan(type(obj))
    values = getter(obj)
    if flat:
        return values
    return [v if enc is None else enc(v) for (_, enc, _), v in zip(_fields(type(obj)), values, strict=True)]


def struct_from_wire(cls: type, values: Any) -> Any:
    spec = _fields(cls)
    if not isinstance(values, list) or len(values) != len(spec):
        raise WireError(f"{cls.__name__}: expected {len(spec)} fields, got {values!r:.200}")
    if _plan(cls)[1]:
        return cls(*values)  # fields in declaration order are the dataclass's positional arguments
    return cls(*[v if dec is None else dec(v) for (_, _, dec), v in zip(spec, values, strict=True)])


def pack_envelope(version: int, by_tag: dict[str, type], msg: Any) -> bytes:
    """``[version, tag, field_1, ...]`` for a message of one of the types by_tag names."""
    cls = type(msg)
    if by_tag.get(getattr(cls, "TAG", None)) is not cls:
        raise WireError(f"{cls.__name__} is not a wire message type")
    return msgpack.packb([version, cls.TAG, *struct_to_wire(msg)], use_bin_type=True)


def unpack_envelope(version: int, by_tag: dict[str, type], data: bytes) -> Any:
    """The message in data, checking its version, type and shape."""
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types
        raise WireError(f"not msgpack: {e}") from e
    if not isinstance(raw, list) or len(raw) < 2:
        raise WireError(f"not a message envelope: {raw!r:.200}")
    if raw[0] != version:
        raise WireError(f"schema version {raw[0]!r}, this build speaks {version}")
    cls = by_tag.get(raw[1])
    if cls is None:
        raise WireError(f"unknown message type {raw[1]!r}")
    try:
        return struct_from_wire(cls, raw[2:])
    except (TypeError, ValueError) as e:
        raise WireError(f"{cls.__name__}: {e}") from e
