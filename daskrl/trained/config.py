"""A graph's ``Config`` rebuilt from plain data (a run's saved config, a ``--config`` YAML file):
the same dataclass the flags build, with one-line errors for keys it does not have."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def _coerce(hint: Any, value: Any) -> Any:
    """``value`` as JSON/YAML wrote it, turned back into ``hint``'s shape (lists into tuples,
    dicts into nested dataclasses); anything else is left to the dataclass's own checks."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _coerce(typing.get_args(hint)[0], value)
    if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return config_from_dict(hint, value)
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(hint):
            if arm is not type(None) and value is not None:
                coerced = _coerce(arm, value)
                if coerced is not value:
                    return coerced
    return value


def config_from_dict(config_cls: type[T], data: Mapping[str, Any], source: str = "config"
                     ) -> T:
    """A ``config_cls`` with the fields in ``data``; the others keep their defaults.

    Raises
    ------
    ValueError
        One line naming ``source`` and a key ``config_cls`` has no field for (with the
        closest field), or the value the dataclass refused.

    Examples
    --------
    >>> @dataclasses.dataclass
    ... class Config:
    ...     hidden: tuple[int, int] = (64, 64)
    ...     lr: float = 1e-3
    >>> config_from_dict(Config, {"hidden": [32, 32], "lr": 1})
    Config(hidden=(32, 32), lr=1.0)
    >>> config_from_dict(Config, {"hiden": [1, 1]}, "run.yaml")
    Traceback (most recent call last):
    ...
    ValueError: run.yaml: unknown key 'hiden'; did you mean 'hidden'? (keys: hidden, lr)
    >>> config_from_dict(Config, {"lr": "fast"}, "run.yaml")
    Traceback (most recent call last):
    ...
    ValueError: run.yaml: lr must be float, got 'fast'
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: expected a mapping of setting names to values, "
                         f"got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(config_cls) if f.init}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{source}: unknown key {key!r}{hint} "
                             f"(keys: {', '.join(fields)})")
    hints = typing.get_type_hints(config_cls, include_extras=True)
    values = {k: _coerce(hints.get(k), v) for k, v in data.items()}
    for key, value in values.items():
        hint = hints.get(key)
        if typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        if hint in (int, float, str, bool) and (
                not isinstance(value, hint) or (hint is int and isinstance(value, bool))):
            raise ValueError(f"{source}: {key} must be {hint.__name__}, got {value!r}")
    try:
        return config_cls(**values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: {exc}") from None


def plain(config: Any) -> dict[str, Any]:
    """``config``'s fields as plain data (tuples as lists) for JSON and YAML.

    Examples
    --------
    >>> @dataclasses.dataclass
    ... class Config:
    ...     hidden: tuple[int, int] = (64, 64)
    >>> plain(Config())
    {'hidden': [64, 64]}
    """
    def walk(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        if isinstance(value, Path):
            return str(value)
        return value

    data = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config
    return walk(data)


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a YAML file; one-line ``ValueError`` when it is not one.

    Examples
    --------
    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "c.yaml"; _ = p.write_text("num_envs: 4\\n")
    >>> read_yaml(p)
    {'num_envs': 4}
    """
    import yaml

    if not path.is_file():
        raise ValueError(f"--config {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = exc.problem_mark if isinstance(exc, yaml.MarkedYAMLError) else None
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise ValueError(f"--config {path}: not valid YAML{line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping of setting names to values, "
                         f"got {type(data).__name__}")
    return data
