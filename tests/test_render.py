"""Pictures of one iteration: every distribution renders, roles labelled, resources coloured."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from daskrl.compat import graph_annotations
from daskrl.observe.render import COLOURS, DOC_PICTURES, iteration_graph, render_iteration

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
    graph, _, placement, dist = iteration_graph(
        str(ROOT / "graphs/ppo.py"), "central-inference",
        {"num_actors": 2, "num_envs": 4, "num_steps": 2})
    assert dist.name == "central-inference" and not dist.dynamic
    pins: dict[str, set[str]] = {}
    for key, notes in graph_annotations(graph).items():
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


def test_a_graph_is_drawn_under_its_own_distribution_and_async_as_a_sketch():
    """No distribution named: the graph's own (A3C: async, dynamic, drawn unrolled)."""
    graph, algo, _, dist = iteration_graph(
        str(ROOT / "graphs/a3c.py"), None,
        {"num_envs": 2, "num_steps": 16, "rollout_steps": 8, "num_actors": 2})
    assert (algo.distribution, dist.name, dist.dynamic) == ("async", "async", True)
    keys = {str(k) for k in graph.__dask_graph__()}
    # 2 actors x 2 rounds of gradients, each applied in turn
    assert sum(k.startswith("grad-") for k in keys) == 4
    assert sum(k.startswith("apply-") for k in keys) == 4


def test_a_refused_distribution_is_not_drawn():
    with pytest.raises(ValueError, match="'split-actor' capability"):
        iteration_graph(str(ROOT / "graphs/mappo.py"), "central-inference",
                        {"num_envs": 4, "num_steps": 2})


def test_daskrl_graph_without_the_graphviz_package_says_which_extra_in_one_line(tmp_path):
    """As on a machine without ``daskrl[graph]``: the import fails, the CLI says one line."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['graphviz'] = None\n"  # `import graphviz` now fails
            "from daskrl.cli import main\n"
            f"sys.exit(main(['graph', {str(ROOT / 'graphs/ppo.py')!r}, '--out', "
            f"{str(tmp_path / 'g.svg')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "daskrl: error: drawing graphs needs the graphviz package: pip install 'daskrl[graph]' "
        "(and Debian's graphviz for `dot`)"]
    assert not (tmp_path / "g.svg").exists()
