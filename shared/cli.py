"""Command line and environment -> a frozen config dataclass.

Each field ``max_total_token_num`` becomes the flag ``--max-total-token-num`` (the
underscore spelling LightLLM users type is accepted too) and the environment variable
``LS_MAX_TOTAL_TOKEN_NUM``; a flag beats the environment, which beats the default.
Only a service's ``__main__`` calls this, passing ``os.environ`` in.
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


def _field_type(f: dataclasses.Field) -> Any:
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    return {"int": int, "float": float, "str": str, "bool": _parse_bool}[kind]


def build_parser(cls: type, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        alias = "--" + f.name
        names = [flag] if alias == flag else [flag, alias]
        parser.add_argument(*names, dest=f.name, type=_field_type(f), default=None, help=f"(default: {f.default!r})")
    return parser


def parse_config(cls: type[C], argv: Sequence[str] | None, env: Mapping[str, str], description: str = "") -> C:
    """Build ``cls`` from flags, then ``LS_*`` environment variables, then defaults."""
    parser = build_parser(cls, description or cls.__doc__ or cls.__name__)
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name)
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
