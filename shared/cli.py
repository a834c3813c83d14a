"""Command line and environment -> a frozen config dataclass.

Each field ``max_total_token_num`` becomes the flag ``--max-total-token-num`` (the
underscore spelling LightLLM users type is accepted too) and the environment variable
``LS_MAX_TOTAL_TOKEN_NUM``; a flag beats the environment, which beats the default.
A ``tuple[str, ...]`` field such as ``api_keys`` is a repeatable flag, named in the
singular too (``--api-key a --api-key b``), and a comma-separated variable
(``LS_API_KEYS=a,b``). Only a service's ``__main__`` calls this, passing ``os.environ`` in.

A field declares its help text, other flag spellings and whether it is also the positional
argument in its metadata (shared/config.py's ``option()``); ``--help`` shows each flag with
its text, its variable and its default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
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


def _help(f: dataclasses.Field) -> str:
    text = f.metadata.get("help", "")
    default = "none" if f.default in ("", ()) else repr(f.default)
    tail = f"[{_env_name(f)}; default: {default}]"
    return (f"{text} {tail}" if text else tail).replace("%", "%%")


def _env_name(f: dataclasses.Field) -> str:
    return "LS_" + f.name.upper()


def _prog() -> str | None:
    """``python -m services.router`` rather than argparse's ``__main__.py``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return f"python -m {spec.parent}" if spec is not None and spec.name.endswith(".__main__") else None


def build_parser(cls: type, description: str, prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog or _prog(), description=description)
    for f in dataclasses.fields(cls):
        aliases = list(f.metadata.get("aliases", ()))
        if f.metadata.get("positional"):
            parser.add_argument(f"_{f.name}", metavar=f.metadata["positional"], nargs="?", default=None, help=_help(f))
        if _is_list(f):
            names = _flags(f.name, repeatable=True) + aliases
            parser.add_argument(*names, dest=f.name, action="append", type=str, default=None, help=_help(f))
        else:
            names = _flags(f.name, False) + aliases
            # a bare boolean flag (--disable-prompt-cache) means true; a value may still follow it
            bare = {"nargs": "?", "const": True} if _field_type(f) is _parse_bool else {}
            parser.add_argument(*names, dest=f.name, type=_field_type(f), default=None, help=_help(f), **bare)
    return parser


def parse_config(
    cls: type[C], argv: Sequence[str] | None, env: Mapping[str, str], description: str = "", prog: str | None = None
) -> C:
    """Build ``cls`` from flags, then ``LS_*`` environment variables, then defaults."""
    parser = build_parser(cls, description or cls.__doc__ or cls.__name__, prog)
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name)
        if value is None and f.metadata.get("positional"):
            value = getattr(args, f"_{f.name}")
        if value is not None and _is_list(f):
            value = tuple(value)
        if value is None:
            raw = env.get(_env_name(f))
            if raw is not None:
                try:
                    value = _field_type(f)(raw)
                except (ValueError, argparse.ArgumentTypeError) as e:
                    raise ConfigError(f"{_env_name(f)}={raw!r}: {e}") from e
        if value is not None:
            values[f.name] = value
    if "replica" in {f.name for f in dataclasses.fields(cls)} and not values.get("replica"):
        values["replica"] = f"{socket.gethostname()}-{os.getpid()}"
    try:
        return cls(**values)
    except ConfigError as e:
        parser.error(str(e))
        raise  # parser.error exits; this keeps type checkers content


def with_key_file(cfg: C) -> C:
    """``cfg`` with the keys of its ``api_key_file`` added to its ``api_keys``: one a line, blank
    lines and '#' comments skipped. A key in a file (or ``LS_API_KEYS``) stays out of the
    command line, which /proc/<pid>/cmdline shows to every user of the host."""
    path = getattr(cfg, "api_key_file", "")
    if not path:
        return cfg
    try:
        with open(path, encoding="utf-8") as f:
            keys = tuple(k for line in f if (k := line.strip()) and not k.startswith("#"))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--api-key-file {path}: {e}") from None
    if not keys:
        raise ConfigError(f"--api-key-file {path}: no key in it")
    return dataclasses.replace(cfg, api_keys=(*cfg.api_keys, *keys))
