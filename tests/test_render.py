"""Pictures of one iteration: every distribution renders, roles labelled, resources coloured."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from daskrl.render import COLOURS, DOC_PICTURES, iteration_graph, render_iteration

ROOT = Path(__file__).resolve().parents[1]
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` not installed")
pytest.importorskip("graphviz")


@needs_dot
@pytest.mark.parametrize("graph,distribution,overrides,workers", DOC_PICTURES,
                         ids=[p[1] for p in DOC_PICTURES])
def test_every_distribution_renders(tmp_path, graph, distribution, overrides, workers):
    out = render_iteration(str(ROOT / graph), distribution, tmp_path / "g.svg", overrides,
                           workers)
    svg = out.read_text()
    assert svg.startswith("<?xml") and distribution.replace("-", "&#45;") in svg
    assert "learner 0" in svg
    assert COLOURS["GPU"] in svg and COLOURS["CPU"] in svg  # learner side and env side


def test_roles_land_on_their_workers():
    graph, _, placement = iteration_graph(str(ROOT / "graphs/ppo.py"), "central-inference",
                                          {"num_actors": 2, "num_envs": 4, "num_steps": 2})
    pins: dict[str, set[str]] = {}
    for layer in graph.__dask_graph__().layers.values():
        notes = layer.annotations or {}
        for key in layer:
            role = str(key).split("-")[0]
            pins.setdefault(role, set()).update(notes.get("workers") or [])
    assert pins["inference"] == {"gpu-0"} and pins["learner"] == {"gpu-0"}
    assert pins["env"] == {"cpu-0", "cpu-1"}
    assert placement.resources["inference"].gpu == 1


@needs_dot
def test_png_and_bad_suffix(tmp_path):
    out = render_iteration(str(ROOT / "graphs/ppo.py"), "single", tmp_path / "g.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="end the file name in .svg, .png or .pdf"):
        render_iteration(str(ROOT / "graphs/ppo.py"), "single", tmp_path / "g.jpg")
