"""examples/dashboard_screenshot.py: clear errors without Chromium or playwright, and pictures
that show drawn task streams and task graphs (skips, saying why, where Chromium or playwright
is not installed: ``apt-get install chromium`` and ``pip install -e '.[screenshot]'``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from script_loader import EXAMPLES, load

REPO = Path(__file__).resolve().parent.parent


shot = load(EXAMPLES / "dashboard_screenshot.py", "dashboard_screenshot")


def test_a_missing_chromium_is_named_with_the_fix(capsys):
    code = shot.main(["--chromium", "/no/such/chromium", "--dashboard", "http://127.0.0.1:9"])
    assert code == 2
    err = capsys.readouterr().err
    assert "chromium '/no/such/chromium' is not an executable file" in err
    assert "apt-get install chromium" in err


def test_no_chromium_on_path_is_named(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shot.main(["--dashboard", "http://127.0.0.1:9"]) == 2
    assert "no chromium on PATH" in capsys.readouterr().err


def test_a_missing_playwright_is_named_with_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "playwright", None)  # import playwright raises ImportError
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)
    with pytest.raises(shot.ScreenshotError, match=r"pip install -e '\.\[screenshot\]'"):
        shot.take_screenshots("http://127.0.0.1:9", ["status"], tmp_path, "/usr/bin/chromium")


def test_bad_pages_are_named(capsys):
    assert shot.main(["--pages", "status,nope", "--dashboard", "http://127.0.0.1:9"]) == 2
    assert "--pages 'status,nope': choose from status, task-stream" in capsys.readouterr().err


def _browser() -> str:
    try:
        chromium = shot.find_chromium()
    except shot.ScreenshotError as exc:
        pytest.skip(str(exc))
    pytest.importorskip("playwright", reason="pip install -e '.[screenshot]'")
    return chromium


@pytest.mark.timeout(300)
def test_pictures_of_a_training_run_show_tasks_and_the_graph(tmp_path):
    import matplotlib.image

    chromium = _browser()
    args = [str(REPO / "graphs" / "ppo.py"), "--no-eval", "--steps", "100000000",
            "--distribution", "central-inference", "--num-actors", "1", "--num-envs", "4",
            "--num-steps", "8"]
    with shot.TrainingRun(args, out=tmp_path / "run") as run:
        address = run.dashboard(timeout=120)
        assert address.startswith("http://127.0.0.1:")
        paths = shot.take_screenshots(address, ["task-stream", "graph"], tmp_path / "png",
                                      chromium, width=1400, height=900, settle=1)
        assert run.proc.poll() is None  # still training while the pictures were taken
    assert run.proc.returncode is not None  # stopped with the pictures
    assert (tmp_path / "run" / "metrics.csv").exists()
    stream, graph = (matplotlib.image.imread(p)[..., :3] for p in paths)
    assert stream.shape == graph.shape == (900, 1400, 3)
    # task rectangles are saturated colours; an undrawn page is grey and white
    coloured = (stream.max(-1) - stream.min(-1)) > 0.3
    assert coloured.mean() > 0.02, f"task stream is blank: {coloured.mean():.4f} coloured"
    # graph nodes and edges inside the plot frame (clear of the title, legend and toolbar)
    marks = int((graph[110:860, 30:1200].min(-1) < 0.8).sum())
    assert marks > 300, f"task graph is blank: {marks} drawn pixels"
