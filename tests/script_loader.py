"""Load a benchmark or example script as a module, for the tests of its functions.

The scripts are not a package: a benchmark imports ``_common`` from its own folder, and a
script's dataclasses look their module up in ``sys.modules``. :func:`script` gives both for
the length of a ``with`` block (a module-scoped fixture), and takes the script's folder off
``sys.path`` and the script's module out of ``sys.modules`` after, so one test file's script
does not shadow another's (a sibling it imported, such as ``_common``, stays imported).
:func:`load` alone leaves the module registered.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
EXAMPLES = ROOT / "examples"


def load(path: Path, name: str) -> ModuleType:
    """Execute the script at ``path`` as a module called ``name``, registered in
    ``sys.modules`` while it runs (a dataclass defined at import looks its module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python script")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


@contextmanager
def script(path: Path, name: str) -> Iterator[ModuleType]:
    """The script at ``path`` as a module called ``name``, with its folder first on
    ``sys.path`` (its sibling imports) for the block; both are undone on exit."""
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        yield load(path, name)
    finally:
        sys.path.remove(folder)
        sys.modules.pop(name, None)
