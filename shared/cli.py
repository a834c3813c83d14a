"""Command line and environment -> a frozen config dataclass.

Each field ``max_total_token_num`` becomes the flag ``--max-total-token-num`` (the
underscore spelling LightLLM users type is accepted too) and the environment variable
``LS_MAX_TOTAL_TOKEN_NUM``; a flag beats the environment, which beats the default.
A ``tuple[str, ...]`` field such as ``api_keys`` is a repeatable flag, named in the
singular too (``--api-key a --api-key b``), and a comma-separated variable
(``LS_API_KEYS=a,b``). Only a service's ``__main__`` calls this, passing ``os.environ`` in.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from shared.config import ConfigError

C = TypeVar("C")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def _type_name(f: dataclasses.Field) -> str:
    return (f.type if isinstance(f.type, str) else str(f.type)).replace(" ", "")


def _is_list(f: dataclasses.Field) -> bool:
    return _type_name(f) == "tuple[str,...]"


def _field_type(f: dataclasses.Field) -> Any:
    if _is_list(f):
        return _parse_list
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    return {"int": int, "float": float, "str": str, "bool": _parse_bool}[kind]


def _parse_list(text: str) -> tuple[str, ...]:
    """A comma-separated environment variable; empty items are dropped."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _flags(name: str, repeatable: bool) -> list[str]:
    stems = [name]
    if repeatable and name.endswith("s"):
        stems.insert(0, name[:-1])  # --api-key for api_keys: one value per flag
    flags = []
    for stem in stems:
        for flag in ("--" + stem.replace("_", "-"), "--" + stem):
            if flag not in flags:
                flags.append(flag)
    return flags


def build_parser(cls: type, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    for f in dataclasses.fields(cls):
        help_text = f"(default: {f.default!r})"
        if _is_list(f):
            names = _flags(f.name, repeatable=True)
            parser.add_argument(*names, dest=f.name, action="append", type=str, default=None, help=help_text)
        else:
            parser.add_argument(*_flags(f.name, False), dest=f.name, type=_field_type(f), default=None, help=help_text)
    return parser


def parse_config(cls: type[C], argv: Sequence[str] | None, env: Mapping[str, str], description: str = "") -> C:
    """Build ``cls`` from flags, then ``LS_*`` environment variables, then defaults."""
    parser = build_parser(cls, description or cls.__doc__ or cls.__name__)
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name)
        if value is not None and _is_list(f):
            value = tuple(value)
        if value is None:
            raw = env.get("LS_" + f.name.upper())
            if raw is not None:
                try:
                    value = _field_type(f)(raw)
                except (ValueError, argparse.ArgumentTypeError) as e:
                    raise ConfigError(f"LS_{f.name.upper()}={raw!r}: {e}") from e
        if value is not None:
            values[f.name] = value
    if not values.get("replica"):
        values["replica"] = f"{socket.gethostname()}-{os.getpid()}"
    try:
        return cls(**values)
    except ConfigError as e:
        parser.error(str(e))
        raise  # parser.error exits; this keeps type checkers content
