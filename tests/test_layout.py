"""The package layout: modules import only from their own or earlier subpackages, in the order
data moves (core, algos, distributions, observe, cluster, runtime, then the CLI), so there is
no import cycle; private ``distributed`` names appear only in :mod:`daskrl.compat`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ("compat", "core", "algos", "distributions", "observe", "cluster", "runtime",
         "trained", "league", "api", "sweeps", "config_flags", "run_flags", "run_reports", "cli")
"""Each subpackage may import from itself and those before it (``compat`` from none)."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "daskrl").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """daskrl modules ``path`` imports (``if TYPE_CHECKING:`` blocks and functions included:
    a cycle there is still a cycle for a reader)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        assert node.level == 0, f"{path}: relative import; daskrl imports by absolute name"
        for name in (node.module, *(f"{node.module}.{a.name}" for a in node.names)):
            if name in modules:
                found.add(name)
    return found


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return ORDER.index(parts[1]) if len(parts) > 1 and parts[1] in ORDER else None


def test_no_module_imports_from_a_later_subpackage():
    modules = _modules()
    upward = []
    for name, path in modules.items():
        mine = _layer(name)
        for dep in _imports(path, modules):
            theirs = _layer(dep)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{name} -> {dep}")
    assert not upward, upward


def test_there_is_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep] if dep in path else [node, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


PRIVATE = re.compile(r"\._correct_state|\.state\.tasks\b|http_application|_submit_job|"
                     r"_close_job|\._job_kwargs|\.new_spec\b|__dask_graph__\(\)\.layers")


def test_private_dask_names_live_only_in_compat():
    offenders = []
    for folder in ("daskrl", "marl", "graphs", "tests", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name in ("compat.py", "test_compat.py", "test_layout.py"):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if PRIVATE.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders


def test_nothing_probes_a_distribution_or_learner_with_getattr():
    probe = re.compile(r"(getattr|hasattr)\((dist|distribution|learner|algo|self\.dist)\b")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in (ROOT / "daskrl").rglob("*.py")
                 for n, line in enumerate(p.read_text().splitlines(), 1) if probe.search(line)]
    assert not offenders, offenders
