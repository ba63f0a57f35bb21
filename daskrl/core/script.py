"""Graph scripts: the Python files (``graphs/ppo.py``) that declare an algorithm's ``Config``
and ``build(config)``, loaded by path; and the one-line error for bad user input."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import types
from pathlib import Path


class UserError(Exception):
    """Bad input: reported as one line on stderr with a non-zero exit."""


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
    spec.loader.exec_module(module)
    missing = [n for n in ("Config", "build") if not hasattr(module, n)]
    if missing or not dataclasses.is_dataclass(module.Config):
        raise UserError(
            f"graph script {path!r} must define a dataclass `Config` and `build(config)` "
            f"returning a daskrl.Algorithm (missing: {', '.join(missing) or 'dataclass Config'})"
        )
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module
