"""Helpers shared by the benchmark scripts: medians, machine facts, JSON and markdown output.

Benchmarks run as scripts (``python benchmarks/<name>.py``), so this module is imported as
``_common`` from the script's own folder.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
"""The repository root (the folder above ``benchmarks/``)."""

DEFAULT_PACKAGES = (
    "daskrl", "dask", "distributed", "torch", "numpy", "gymnasium", "stable-baselines3",
    "vmas", "mpe2", "pettingzoo",
)


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def median(values: Iterable[float | None], missing_as: float | None = None) -> float | None:
    """Median of ``values``; ``None``/NaN entries are dropped, or count as ``missing_as``.

    Returns ``None`` when nothing is left; ``math.inf`` when the median itself is a
    missing entry counted as ``missing_as=math.inf`` (e.g. "never reached the target").

    Examples
    --------
    >>> median([3.0, 1.0, 2.0])
    2.0
    >>> median([1.0, None, 5.0]) is not None, median([None]) is None
    (True, True)
    >>> median([10.0, None, None], missing_as=math.inf)
    inf
    """
    kept: list[float] = []
    for v in values:
        if _is_missing(v):
            if missing_as is not None:
                kept.append(missing_as)
        else:
            kept.append(float(v))  # type: ignore[arg-type]
    return float(statistics.median(kept)) if kept else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or ``None`` when either is missing, infinite or zero.

    Examples
    --------
    >>> ratio(6.0, 2.0), ratio(1.0, 0.0), ratio(None, 2.0)
    (3.0, None, None)
    """
    if _is_missing(numerator) or _is_missing(denominator):
        return None
    if not math.isfinite(numerator) or not math.isfinite(denominator) or denominator == 0:
        return None
    return numerator / denominator


def load_average() -> dict[str, Any]:
    """The 1, 5 and 15 minute load averages and the ``uptime`` line, taken now."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        one = five = fifteen = float("nan")
    try:
        line = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        line = ""
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_1m": one, "load_5m": five,
            "load_15m": fifteen, "uptime": line.strip()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def package_versions(names: Sequence[str] = DEFAULT_PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution name (``None`` when not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def machine_info(packages: Sequence[str] = DEFAULT_PACKAGES) -> dict[str, Any]:
    """What the numbers were measured on: CPU, OS, Python, package versions, git state."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gib = float("nan")
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "memory_gib": round(mem_gib, 1),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "packages": package_versions(packages),
        "git_commit": _git("rev-parse", "--short", "HEAD") or None,
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else ("inf" if value == math.inf else value)
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as indented JSON (NaN as ``null``, infinity as ``"inf"``), making folders.

    Examples
    --------
    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "r" / "x.json"
    >>> write_json(p, {"a": float("nan"), "b": math.inf}); p.read_text()
    '{\\n  "a": null,\\n  "b": "inf"\\n}\\n'
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # a new file moved over the old: a call reading it meanwhile sees one or the other whole
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(_clean(data), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a table: ``digits`` significant digits, thousands grouped; ``-`` if missing.

    Examples
    --------
    >>> fmt(12345.6), fmt(0.04213), fmt(None), fmt(math.inf), fmt(True)
    ('12,346', '0.0421', '-', 'not reached', 'yes')
    """
    if isinstance(value, bool):
        return "yes" if value else "no"
    if _is_missing(value):
        return "-"
    if isinstance(value, int | float):
        if value == math.inf:
            return "not reached"
        if abs(value) >= 10 ** digits:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
                   align: str | None = None) -> str:
    """A GitHub markdown table; ``align`` is one letter per column (``l``, ``r``, ``c``).

    Cells that are not strings go through :func:`fmt`.

    Examples
    --------
    >>> print(markdown_table(["x", "y"], [["a", 1.5]], align="lr"))
    | x | y |
    |:--|--:|
    | a | 1.5 |
    """
    align = align or "l" + "r" * (len(headers) - 1)
    marks = {"l": ":--", "r": "--:", "c": ":-:"}
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(marks[a] for a in align) + "|"]
    for row in rows:
        cells = [c if isinstance(c, str) else fmt(c) for c in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def finished_runs(path: Path) -> list[dict[str, Any]]:
    """The runs with a final evaluation that an earlier call recorded under ``"runs"`` in the
    JSON at ``path`` (none when there is no file), for a benchmark that keeps its runs.

    >>> finished_runs(Path("no-such.json"))
    []
    """
    if not path.exists():
        return []
    return [r for r in json.loads(path.read_text()).get("runs", [])
            if r.get("final_eval") is not None]


def update_section(path: Path, name: str, body: str) -> None:
    """Replace the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` in ``path``.

    Appends a new marked section at the end when the markers are absent, so each benchmark
    rewrites only its own part of a shared README.
    """
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + block + tail
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    path.write_text(text)


def run_config(graph: Any, run: Path) -> Any:
    """The graph's ``Config`` with the settings ``run`` trained with (its ``config.yaml``)."""
    import dataclasses

    import yaml

    saved = yaml.safe_load((run / "config.yaml").read_text())
    names = {f.name for f in dataclasses.fields(graph.Config)}
    return graph.Config(**{k: v for k, v in saved.items() if k in names})


def graph_setting(text: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` of ``--set``, the value read as JSON when it parses (numbers, true).

    >>> graph_setting("update_epochs=4"), graph_setting("env=CartPole-v1")
    (('update_epochs', 4), ('env', 'CartPole-v1'))
    """
    field, sep, value = text.partition("=")
    if not sep or not field:
        raise argparse.ArgumentTypeError(f"--set {text!r}: write FIELD=VALUE, e.g. "
                                         "update_epochs=4")
    try:
        return field, json.loads(value)
    except json.JSONDecodeError:
        return field, value


def run_or_read(cmd: Sequence[str], out: Path, may_run: bool = True,
                files: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``summary.json`` of the run that ``cmd`` trains into ``out``: run it first unless
    it is already there from the same command (a suite resumes where it stopped), noting the
    load it started at. ``files`` (name -> text) are written into ``out`` just before it runs
    (a peer's spec).

    A folder left by a run that did not finish, or by another command (settings changed
    since), is emptied and run again, saying so: it holds the suite's own runs only.

    Returns ``{"summary": ..., "ran_now": bool, "load_before": ...}``, ``{"missing": True}``
    when not there and ``may_run`` is off, or ``{"error": stderr tail, "command": cmd}``.
    """
    import shutil

    said = [sys.executable if part == sys.executable else part for part in cmd]
    stored = out / "command.json"
    same = ((not stored.is_file() or json.loads(stored.read_text())[1:] == said[1:])
            and all(not (out / name).is_file() or (out / name).read_text() == text
                    for name, text in (files or {}).items()))
    ran = False
    if not (out / "summary.json").is_file() or not same:
        if not may_run:
            return {"missing": True}
        if out.exists():
            why = "another command" if not same else "a run that did not finish"
            print(f"{out}: emptied ({why}), run again", file=sys.stderr)
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name, text in (files or {}).items():
            (out / name).write_text(text)
        stored.write_text(json.dumps(said))
        load = load_average()
        done = subprocess.run(list(cmd), capture_output=True, text=True, cwd=ROOT)
        if done.returncode or not (out / "summary.json").is_file():
            return {"command": list(cmd), "error": done.stderr[-2000:]}
        (out / "load_before.json").write_text(json.dumps(load))
        ran = True
    load_file = out / "load_before.json"
    return {"summary": json.loads((out / "summary.json").read_text()), "ran_now": ran,
            "load_before": json.loads(load_file.read_text()) if load_file.is_file() else None}


def run_all(jobs: Sequence[Any], run: Any, parallel: int, describe: Any) -> list[Any]:
    """``run(job)`` for each of ``jobs``, ``parallel`` at once, under a progress bar whose note
    is ``describe(job, result)`` of the last one finished; the results in the jobs' order."""
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    with ThreadPoolExecutor(parallel) as pool, tqdm(total=len(jobs), unit="run") as bar:
        def one(job: Any) -> Any:
            result = run(job)
            bar.set_postfix_str(describe(job, result))
            bar.update()
            return result
        return list(pool.map(one, jobs))


def late_return(out: Path, share: float = 0.1) -> float | None:
    """Mean training return (``episode_return_mean``) over the last ``share`` of a run's
    iterations that finished episodes; None when none did."""
    from daskrl.observe.metrics import iteration_rows

    returns = [float(r["episode_return_mean"]) for r in iteration_rows(out)
               if r.get("episode_return_mean")]
    tail = returns[-max(1, int(len(returns) * share)):]
    return sum(tail) / len(tail) if tail else None
