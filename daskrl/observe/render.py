"""Pictures of one training iteration's task graph: fragments labelled by role, coloured by the
resource they ask for, grouped by the worker they are pinned to.

``daskrl graph GRAPH --distribution NAME --out FILE.svg`` calls :func:`render_iteration`.
The graph is built exactly as the driver builds it, for an illustrative cluster (two CPU
workers and one GPU worker, by default) instead of a live one.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dask.delayed import Delayed, delayed
from dask.utils import key_split

from daskrl.compat import graph_annotations
from daskrl.core.fragment import Fragment
from daskrl.core.keys import task_key
from daskrl.core.placement import plan_placement
from daskrl.core.roles import coordinate, evaluate
from daskrl.core.script import MissingExtra
from daskrl.distributions import Distribution, IterationInputs, get_distribution, is_auto
from daskrl.distributions.base import coordinated

EXAMPLE_WORKERS: dict[str, dict[str, float]] = {
    "cpu-0": {"CPU": 1}, "cpu-1": {"CPU": 1}, "gpu-0": {"CPU": 1, "GPU": 1}}
"""The cluster pictures are drawn for: two CPU workers and one GPU worker."""

COLOURS = {"GPU": "#b7e1a1", "CPU": "#a9c8f0", "other": "#f3d49b", "none": "#e4e4e4"}
"""Node fill by the resource a task asks for (GPU wins over CPU, CPU over custom keys)."""

_RUN = "run"


def iteration_graph(graph_path: str, distribution: str | None,
                    overrides: Mapping[str, Any] | None = None,
                    workers: Mapping[str, Mapping[str, float]] | None = None,
                    iteration: int = 1) -> tuple[Delayed, Any, Any, Distribution]:
    """The delayed graph of one iteration of ``graph_path`` under ``distribution``.

    Returns ``(graph, algorithm, placement, distribution)``. ``distribution`` None takes
    the algorithm's own (``Algorithm.distribution``). The previous iteration's learner
    output is a placeholder task, so the picture shows what each task takes from it. The
    graph is the distribution's :meth:`~daskrl.distributions.Distribution.sketch`: a
    dynamic iteration (``async``) is drawn unrolled.

    Examples
    --------
    >>> g, algo, _, dist = iteration_graph("graphs/ppo.py", "actors-learner")  # doctest: +SKIP
    """
    from daskrl.core.script import load_graph

    module = load_graph(graph_path)
    try:
        algo = module.build(module.Config(**dict(overrides or {})))
    except TypeError as exc:
        raise ValueError(f"{graph_path}: {exc}; pass only fields of its Config") from None
    dist = get_distribution(distribution or algo.distribution)
    dist.check(algo)
    frags = dist.fragments(algo)
    frags.append(Fragment(evaluate, "evaluate", algo.resources_for("evaluate")))
    if algo.make_coordinator is not None:
        frags.append(Fragment(coordinate, "coordinator", algo.resources_for("coordinator")))
    placement = plan_placement(frags, dict(workers or EXAMPLE_WORKERS))
    learner_in = _previous(iteration, placement.worker("learner", 0))
    inputs = IterationInputs(algo, placement, _RUN, 0, iteration, iteration + 2, learner_in)
    graph = dist.sketch(inputs)
    if algo.make_coordinator is not None:  # as the run loop follows each iteration
        graph = coordinated(inputs, graph, learner_in)
    return graph, algo, placement, dist


def _previous(iteration: int, worker: str | None) -> Delayed:
    """A stand-in for iteration ``k - 1``'s learner output."""
    import dask

    with dask.annotate(workers=[worker] if worker else None):
        return delayed(_placeholder, pure=False)(
            dask_key_name=task_key("learner", 0, iteration - 1, _RUN))


def _placeholder() -> None:
    return None


def to_digraph(graph: Delayed, title: str = "") -> Any:
    """A ``graphviz.Digraph`` of ``graph``'s tasks: one box per task, labelled with its role,
    replica, step and worker, filled by the resource it asks for.

    Examples
    --------
    >>> d = delayed(abs, pure=False)(-1, dask_key_name="learner-0-it0-run")
    >>> "learner 0" in to_digraph(d).source
    True
    """
    try:
        import graphviz
    except ImportError:
        raise MissingExtra("drawing graphs", "graph", "the graphviz package",
                           " (and Debian's graphviz for `dot`)") from None
    hlg = graph.__dask_graph__()
    deps = hlg.get_all_dependencies()
    annotations = graph_annotations(graph)
    where: dict[Any, tuple[str | None, str]] = {}
    for key in hlg:
        notes = annotations.get(key, {})
        pin = notes.get("workers")
        worker = pin[0] if pin else None  # a strict pin or a preference: drawn alike
        where[key] = (worker, _colour(notes.get("resources") or {}))
    dot = graphviz.Digraph(graph_attr={"rankdir": "LR", "fontname": "Helvetica",
                                       "label": title, "labelloc": "t", "fontsize": "16"},
                           node_attr={"shape": "box", "style": "rounded,filled",
                                      "fontname": "Helvetica", "fontsize": "11"},
                           edge_attr={"color": "#777777", "arrowsize": "0.6"})
    for key, (worker, colour) in where.items():
        label = _label(key) + (f"\n@{worker}" if worker else "")
        dot.node(_node_id(key), label, fillcolor=colour)
    for key in sorted(deps, key=str):  # sorted: the same picture every time
        for parent in sorted(deps[key], key=str):
            if parent in where and key in where:
                dot.edge(_node_id(parent), _node_id(key))
    legend = graphviz.Digraph(name="cluster_legend", graph_attr={"label": "resources",
                                                                 "style": "dotted"})
    for name in ("GPU", "CPU", "none"):
        legend.node(f"legend_{name}", name if name != "none" else "no slot",
                    fillcolor=COLOURS[name])
    dot.subgraph(legend)
    return dot


def _colour(resources: Mapping[str, float]) -> str:
    if resources.get("GPU"):
        return COLOURS["GPU"]
    if resources.get("CPU"):
        return COLOURS["CPU"]
    return COLOURS["other"] if resources else COLOURS["none"]


def _node_id(key: Any) -> str:
    return str(key).replace(":", "_")


def _label(key: Any) -> str:
    """``env-0g1-it3-s5-run`` -> ``env 0g1 · s5``; ``learner-0-it2-run`` -> ``learner 0 · it2``."""
    text = str(key[0] if isinstance(key, tuple) else key)
    role = key_split(text)
    parts = text[len(role) + 1 :].split("-")
    if parts and parts[-1] == _RUN:
        parts = parts[:-1]
    replica = parts[0] if parts else ""
    rest = parts[1:]
    if len(rest) > 1:  # a step inside the iteration: the iteration is in the title
        rest = rest[1:]
    return " · ".join(filter(None, [f"{role} {replica}".strip(), *rest]))


def render_iteration(graph_path: str, distribution: str | None, out: str | Path,
                     overrides: Mapping[str, Any] | None = None,
                     workers: Mapping[str, Mapping[str, float]] | None = None) -> Path:
    """Draw one iteration of ``graph_path`` under ``distribution`` into ``out`` (.svg or .png).

    Parameters
    ----------
    graph_path : str
        A graph script, e.g. ``graphs/ppo.py``.
    distribution : str or None
        A distribution name with options, e.g. ``data-parallel:allreduce=dask`` (None: the
        graph's own).
    out : str or Path
        The picture; its suffix (``.svg``, ``.png``, ``.pdf``) picks the format.
    overrides : mapping, optional
        Config fields to change first (e.g. ``{"num_steps": 3}`` keeps a per-step
        distribution's picture readable).
    workers : mapping, optional
        Worker name -> resources to place on (default :data:`EXAMPLE_WORKERS`).

    Returns
    -------
    Path
        The file written.

    Examples
    --------
    >>> render_iteration("graphs/ppo.py", "single", "single.svg")  # doctest: +SKIP
    PosixPath('single.svg')
    """
    out = Path(out)
    fmt = out.suffix.lstrip(".").lower()
    if is_auto(distribution):
        raise ValueError("--distribution auto is chosen on a cluster when a run starts: "
                         "draw one of the distributions it may pick (daskrl train --help "
                         "names them)")
    if fmt not in ("svg", "png", "pdf"):
        raise ValueError(f"--out {str(out)!r}: end the file name in .svg, .png or .pdf")
    if shutil.which("dot") is None:
        raise RuntimeError("graphviz's `dot` program is not installed: apt-get install "
                           "graphviz (or brew install graphviz)")
    graph, algo, _, dist = iteration_graph(graph_path, distribution, overrides, workers)
    n = len(graph.__dask_graph__())
    title = (f"{algo.name} · {distribution or dist.name} · one iteration ({n} tasks; "
             f"{algo.num_actors} x {algo.num_envs} envs x {algo.num_steps} steps)"
             + ("\nsubmitted as they complete; drawn arriving in turn" if dist.dynamic else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(to_digraph(graph, title).pipe(format=fmt))
    return out


DOC_PICTURES: tuple[tuple[str, str, dict[str, Any], dict[str, dict[str, float]] | None], ...] = (
    ("graphs/ppo.py", "actors-learner", {"num_actors": 2, "num_envs": 4}, None),
    ("graphs/ppo.py", "central-inference", {"num_actors": 2, "num_envs": 4, "num_steps": 3},
     None),
    ("graphs/ppo.py", "data-parallel",
     {"num_actors": 2, "num_envs": 4, "update_epochs": 1, "num_minibatches": 2},
     {"gpu-0": {"CPU": 1, "GPU": 1}, "gpu-1": {"CPU": 1, "GPU": 1}}),
    ("graphs/ppo.py", "single", {"num_actors": 2, "num_envs": 4}, None),
    ("graphs/a3c.py", "async", {"num_envs": 4, "num_steps": 24, "rollout_steps": 8}, None),
    ("graphs/impala.py", "impala", {"num_actors": 2, "num_envs": 4}, None),
)
"""One picture per distribution under ``docs/graphs/``: small settings keep per-step graphs
readable."""


def render_docs(out_dir: str | Path = "docs/graphs", fmt: str = "svg") -> list[Path]:
    """Draw :data:`DOC_PICTURES` into ``out_dir/<distribution>.<fmt>`` (run from the repo root).

    Examples
    --------
    >>> render_docs("docs/graphs")  # doctest: +SKIP
    """
    return [render_iteration(graph, dist, Path(out_dir) / f"{dist}.{fmt}", overrides, workers)
            for graph, dist, overrides, workers in DOC_PICTURES]
