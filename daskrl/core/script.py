"""Graph scripts: the Python files (``graphs/ppo.py``) that declare an algorithm's ``Config``
and ``build(config)``, loaded by path; and the one-line error for bad user input."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import traceback
import types
from pathlib import Path
from typing import Any


class UserError(Exception):
    """Bad input: reported as one line on stderr with a non-zero exit."""


class MissingExtra(ImportError):
    """An optional package is not installed: the CLI reports it in one line, naming the
    extra that installs it.

    Examples
    --------
    >>> str(MissingExtra("drawing graphs", "graph", "graphviz"))
    "drawing graphs needs graphviz: pip install 'daskrl[graph]'"
    """

    def __init__(self, what: str, extra: str, package: str, hint: str = "") -> None:
        super().__init__(f"{what} needs {package}: pip install 'daskrl[{extra}]'{hint}")
        self.extra, self.package = extra, package


def load_graph(path: str) -> types.ModuleType:
    """Import a graph script by path; it must define ``Config`` and ``build(config)``.

    The module is pickled by value, so workers need not have the script on their path.

    Raises
    ------
    UserError
        When the file is missing, not Python, or lacks ``Config``/``build``.

    Examples
    --------
    >>> load_graph("no_such_graph.py")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    daskrl.core.script.UserError: graph script 'no_such_graph.py' not found: pass a path ...
    """
    file = Path(path)
    if not file.is_file():
        raise UserError(f"graph script {path!r} not found: pass a path like graphs/ppo.py")
    name = f"daskrl_graph_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot import graph script {path!r}: is it a .py file?")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[name]
        raise UserError(f"{exc.filename or path}:{exc.lineno}: syntax error in the graph script: "
                        f"{exc.msg}") from None
    except Exception as exc:
        del sys.modules[name]
        raise UserError(f"graph script {path!r} raised while being imported: "
                        f"{type(exc).__name__}: {exc}{_where(exc, file)}") from None
    missing = [n for n in ("Config", "build") if not hasattr(module, n)]
    if missing or not dataclasses.is_dataclass(module.Config):
        raise UserError(
            f"graph script {path!r} must define a dataclass `Config` and `build(config)` "
            f"returning a daskrl.Algorithm (missing: {', '.join(missing) or 'dataclass Config'})"
        )
    bad = unsupported_field(module.Config)
    if bad is not None:
        field_name, hint = bad
        raise UserError(f"graph script {path!r}: Config field {field_name!r} has type {hint}, "
                        "which no command-line flag can hold; use bool, int, float, str, "
                        "pathlib.Path, an Enum, a Literal, a tuple or list of those, or a "
                        "nested dataclass")
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


_SCALARS = (bool, int, float, str, Path, type(None))


def unsupported_field(config_cls: type) -> tuple[str, str] | None:
    """The first field of ``config_cls`` (or of a nested dataclass) whose type the
    command-line flags cannot hold, as ``(name, type)``; None when every one can.

    Examples
    --------
    >>> @dataclasses.dataclass
    ... class Config:
    ...     lr: float = 1e-3
    ...     hidden: tuple[int, ...] = (64, 64)
    ...     device: object = None
    >>> unsupported_field(Config)
    ('device', 'object')
    """
    import enum
    import typing

    try:
        hints = typing.get_type_hints(config_cls)
    except Exception:  # noqa: BLE001 - an unresolvable name is reported with the flags
        return None

    def ok(hint: Any) -> bool:
        origin = typing.get_origin(hint)
        if origin is typing.Literal:
            return True
        if origin is not None:  # Union, Optional, tuple[...], list[...], dict[...], X | Y
            return all(a is Ellipsis or ok(a) for a in typing.get_args(hint))
        if isinstance(hint, type):
            return (issubclass(hint, (*_SCALARS, enum.Enum))
                    or (dataclasses.is_dataclass(hint) and unsupported_field(hint) is None))
        return False

    for f in dataclasses.fields(config_cls):
        hint = hints.get(f.name)
        if f.init and hint is not None and not ok(hint):
            return f.name, getattr(hint, "__name__", str(hint))
    return None


def build_algorithm(module: types.ModuleType, config: Any, path: str) -> Any:
    """``module.build(config)``, which must return a :class:`daskrl.Algorithm`.

    Raises
    ------
    UserError
        One line: what ``build`` raised and where in the script, or what it returned.
    ValueError
        ``build``'s own refusal of a setting, as it raised it.

    Examples
    --------
    >>> m = types.ModuleType("g"); m.build = lambda config: None
    >>> build_algorithm(m, None, "g.py")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    daskrl.core.script.UserError: g.py: build(config) returned NoneType; expected a daskrl...
    """
    from daskrl.core.algorithm import Algorithm

    try:
        algo = module.build(config)
    except (UserError, ValueError):
        raise  # build's own refusal of a setting: its message is the line
    except Exception as exc:
        raise UserError(f"{path}: build(config) raised {type(exc).__name__}: {exc}"
                        f"{_where(exc, Path(path))}") from None
    if not isinstance(algo, Algorithm):
        raise UserError(f"{path}: build(config) returned {type(algo).__name__}; expected a "
                        "daskrl.Algorithm")
    return algo


def _where(exc: BaseException, script: Path) -> str:
    """`` (at FILE:LINE in FUNCTION)`` for the innermost frame of ``script`` in ``exc``'s
    traceback ('' when none is the script's)."""
    found = ""
    target = script.resolve()
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            same = Path(frame.filename).resolve() == target
        except OSError:
            same = False
        if same:
            found = f" (at {frame.filename}:{frame.lineno} in {frame.name})"
    return found
