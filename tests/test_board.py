"""The dashboard's daskrl page (``/daskrl``), its JSON and the ``daskrl_`` gauges on
``/metrics``: real schedulers, real runs, and a real headless Chromium for the page (those
tests skip, saying why, where Chromium or playwright is not installed:
``apt-get install chromium`` and ``pip install -e '.[screenshot]'``)."""

from __future__ import annotations

import csv
import io
import json
import math
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import pytest
import yaml
from distributed import Client, LocalCluster
from script_loader import EXAMPLES, load

from daskrl.cluster.local import local_cluster
from daskrl.distributions import get_distribution
from daskrl.observe.board import FIGURES, Board, board_settings
from daskrl.observe.board_feed import RunFeed, page_line
from daskrl.runtime.dask_backend import DaskBackend
from daskrl.runtime.driver import RunSettings, train

REPO = Path(__file__).resolve().parent.parent


# its Chromium lookup and TrainingRun (daskrl train, dashboard line)
shot = load(EXAMPLES / "dashboard_screenshot.py", "dashboard_screenshot")
SHOWN = ("iteration", "env_steps", "episode_return_mean", "env_steps_per_s", "policy_lag",
         "learner_busy", "replay_size")
"""Columns of the page's run row that come straight from ``metrics.csv``."""

pytestmark = pytest.mark.timeout(300)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def _base(client: Client) -> str:
    """The dashboard's address, e.g. ``http://127.0.0.1:8787``."""
    return client.dashboard_link.rsplit("/", 1)[0]


def _rows(out: Path) -> list[dict[str, str]]:
    """``metrics.csv``'s complete rows (one being written as it is read is left out)."""
    path = out / "metrics.csv"
    text = path.read_text() if path.exists() else ""
    return list(csv.DictReader(io.StringIO(text[: text.rfind("\n") + 1], newline="")))


def _close(shown: float | None, written: str) -> bool:
    """A figure the page or a gauge shows against its ``metrics.csv`` cell (6 significant
    digits there)."""
    if written == "":
        return shown is None
    return shown is not None and math.isclose(shown, float(written), rel_tol=1e-5,
                                              abs_tol=1e-12)


def _board_run(base: str, out: Path) -> dict[str, Any]:
    runs = json.loads(_get(f"{base}/daskrl/runs.json"))["board"]["runs"]
    mine = [r for r in runs if r.get("out") == str(out.resolve())]
    assert len(mine) == 1, [r.get("out") for r in runs]
    return mine[0]


def test_a_long_run_keeps_a_bounded_board_with_its_whole_curve():
    board, rows = Board(keep=64, max_runs=3), 20_000
    for i in range(1, rows + 1):
        row = {"iteration": i, "env_steps": 8 * i, "episode_return_mean": float(i)}
        if i % 10 == 0:
            row.update(eval_return_mean=2.0 * i, eval_iteration=i)
        board.take({"kind": "row", "run": "long", "row": row})
    track = board.runs["long"]
    history = track.history["iteration"]
    assert len(history) < 64 and len(track.evals) < 64
    assert history[0] == 1 and history[-1] > rows - 2 * track.stride  # the whole run
    steps = {b - a for a, b in zip(history[:-1], history[1:], strict=True)}
    assert steps == {track.stride}, steps  # evenly spaced
    assert track.latest["iteration"] == rows and track.latest["eval_return_mean"] == 2 * rows
    board.take({"kind": "start", "run": "a"})
    board.take({"kind": "end", "run": "a", "status": "finished"})
    board.take({"kind": "start", "run": "b"})
    board.take({"kind": "start", "run": "c"})
    assert sorted(board.runs) == ["b", "c", "long"]  # an ended run goes first
    board.take({"kind": "start", "run": "d"})
    assert sorted(board.runs) == ["b", "c", "d"]  # then the one heard from longest ago


def test_an_evaluation_is_drawn_at_the_env_steps_of_the_iteration_it_evaluated():
    board = Board()
    for i in range(1, 6):
        row = {"iteration": i, "env_steps": 8 * i}
        if i == 4:  # the evaluation of iteration 2 finished during iteration 4
            row.update(eval_iteration=2, eval_return_mean=9.0)
        board.take({"kind": "row", "run": "r", "row": row})
    board.take({"kind": "row", "run": "r", "row": {"env_steps": 40, "eval_iteration": 5,
                                                    "eval_return_mean": 11.0}})
    track = board.runs["r"]
    assert track.evals == [(16.0, 2.0, 9.0), (40.0, 5.0, 11.0)]
    assert track.latest["iteration"] == 5 and track.latest["eval_return_mean"] == 11.0


def test_a_bad_message_is_counted_not_kept():
    board = Board()
    for msg in ("text", {"kind": "row"}, {"kind": "end", "run": "r", "status": "odd"}):
        board.take(msg)
    assert board.ignored == 3 and board.runs["r"].status == "running"


def _docs_block(page: str, name: str) -> str:
    """The text of the code block named ``name`` (its ``:name:`` option) on ``docs/<page>``."""
    lines = (REPO / "docs" / page).read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == f":name: {name}")
    body = []
    for line in lines[at + 1:]:
        if line.strip().startswith("```"):
            break
        if not line.strip().startswith(":"):
            body.append(line)
    return textwrap.dedent("\n".join(body)).strip() + "\n"


@pytest.fixture(scope="module")
def user_scheduler() -> Iterator[Client]:
    """A Dask user's LocalCluster, its scheduler told to serve the page by the Dask config
    docs/howto/dashboard.md gives (the route module in ``distributed.scheduler.http.routes``).
    Thread workers: nothing to start but the threads, torch is imported here already."""
    config = yaml.safe_load(_docs_block("howto/dashboard.md", "board-config"))
    routes = config["distributed"]["scheduler"]["http"]["routes"]
    assert routes == board_settings(dask.config.get("distributed.scheduler.http.routes"))[
        "distributed.scheduler.http.routes"]  # Dask's defaults, and the page's module
    with dask.config.set({"distributed.scheduler.http.routes": routes}):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                               protocol="tcp://", host="127.0.0.1",
                               dashboard_address="127.0.0.1:0")
    client = Client(cluster)
    try:
        client.wait_for_workers(2, timeout=60)
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture(scope="module")
def two_runs(user_scheduler, cluster_tiny_ppo, tmp_path_factory) -> dict[str, Any]:
    """Two PPO runs trained at once on the user's scheduler by two drivers (clients),
    each registering the board plugin with Client.register_plugin; one evaluates every 2
    iterations."""
    outs = [tmp_path_factory.mktemp("board") / name for name in ("run-a", "run-b")]
    results: dict[Path, Any] = {}

    def run(out: Path, **kwargs: Any) -> None:
        settings = RunSettings(out=out, steps=768, tensorboard=False, progress=False,
                               **kwargs)
        try:
            with Client(user_scheduler.scheduler.address) as client:
                results[out] = train(client, cluster_tiny_ppo(),
                                     get_distribution("actors-learner"), settings)
        except BaseException as exc:  # noqa: BLE001 - raised in the test
            results[out] = exc

    threads = [threading.Thread(target=run, args=(outs[0],), kwargs={"eval_every": 2}),
               threading.Thread(target=run, args=(outs[1],), kwargs={"eval": False})]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    for out in outs:
        assert isinstance(results.get(out), dict), results.get(out)
    return {"client": user_scheduler, "outs": outs, "summaries": results}


def test_each_run_is_one_row_whose_latest_figures_are_metrics_csvs_last_row(two_runs):
    base = _base(two_runs["client"])
    ids = set()
    for out in two_runs["outs"]:
        run = _board_run(base, out)
        ids.add(run["run"])
        assert run["status"] == "finished" and run["name"] == out.name
        assert run["graph"] == "ppo" and run["distribution"] == "actors-learner"
        last = [r for r in _rows(out) if r["iteration"]][-1]
        latest = run["latest"]
        for column in FIGURES:
            if column in last and not column.startswith("eval_"):
                assert _close(latest.get(column), last[column]), (column, latest, last)
        assert run["history"]["iteration"] == [1, 2, 3]
    assert len(ids) == 2
    evaluated = _board_run(base, two_runs["outs"][0])
    written = [float(v) for r in _rows(two_runs["outs"][0]) if r.get("eval_return_mean")
               for v in (r["eval_iteration"], r["eval_return_mean"])]
    final = two_runs["summaries"][two_runs["outs"][0]]["eval_return_mean"]
    points = [v for _, it, ret in evaluated["evals"] for v in (it, ret)]
    assert len(written) >= 2 and points[:-2] == pytest.approx(written, rel=1e-5)
    assert points[-2:] == pytest.approx([3, final])  # the final evaluation (the summary's)
    assert _board_run(base, two_runs["outs"][1])["evals"] == []


def test_metrics_serves_daskrl_gauges_labelled_by_run(two_runs):
    from prometheus_client.parser import text_string_to_metric_families

    base = _base(two_runs["client"])
    text = _get(f"{base}/metrics")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert any(name.startswith("dask_scheduler_") for name, _ in samples)  # Dask's own
    gauges = {"iteration": "daskrl_iteration", "env_steps": "daskrl_env_steps",
              "episode_return_mean": "daskrl_episode_return_mean",
              "env_steps_per_s": "daskrl_env_steps_per_second",
              "policy_lag": "daskrl_policy_lag"}
    for out in two_runs["outs"]:
        run = _board_run(base, out)["run"]
        last = [r for r in _rows(out) if r["iteration"]][-1]
        for column, name in gauges.items():
            assert _close(samples.get((name, (("run", run),))), last[column]), (name, run)
        part = samples.get(("daskrl_iteration_part_seconds", (("part", "learn"), ("run", run))))
        assert _close(part, last["time/learn_s"])
        assert samples[("daskrl_run_status", (("run", run), ("status", "finished")))] == 1.0
        assert samples[("daskrl_run_status", (("run", run), ("status", "running")))] == 0.0


def test_the_embedded_cluster_serves_the_page_and_holds_the_board():
    cluster = local_cluster([{"CPU": 1}], processes=False)
    client = Client(cluster)
    try:
        DaskBackend(client)  # what every daskrl driver does: registers the board plugin
        feed = RunFeed(client.log_event, "r0", {"name": "tiny"})
        feed.row({"iteration": 1, "env_steps": 32, "episode_return_mean": 7.25})
        feed.end("stopped")
        reply = json.loads(_get(f"{_base(client)}/daskrl/runs.json"))
        (run,) = reply["board"]["runs"]
        assert (run["run"], run["name"], run["status"]) == ("r0", "tiny", "stopped")
        assert run["latest"] == {"iteration": 1.0, "env_steps": 32.0,
                                 "episode_return_mean": 7.25}
        assert "daskrl runs" in _get(f"{_base(client)}/daskrl")
    finally:
        client.close()
        cluster.close()


def _bare_scheduler(routes: list[str]) -> LocalCluster:
    with dask.config.set({"distributed.scheduler.http.routes": routes}):
        return LocalCluster(n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1",
                            dashboard_address="127.0.0.1:0")


def test_a_scheduler_without_the_plugin_or_the_routes_says_how_to_get_them():
    dasks = [r for r in dask.config.get("distributed.scheduler.http.routes")
             if not r.startswith("daskrl.")]
    cluster = _bare_scheduler(board_settings(dasks)["distributed.scheduler.http.routes"])
    try:
        with Client(cluster) as client:
            reply = json.loads(_get(f"{_base(client)}/daskrl/runs.json"))
            assert page_line(client.dashboard_link) == f"daskrl page: {_base(client)}/daskrl"
        assert reply["board"]["runs"] == []
        assert "--preload daskrl.observe.board_plugin" in reply["board"]["note"]
    finally:
        cluster.close()
    cluster = _bare_scheduler(dasks)  # Dask's defaults: no page
    try:
        with Client(cluster) as client:
            line = page_line(client.dashboard_link)
        assert line == ("daskrl page: not served by this scheduler; add "
                        "daskrl.observe.board_routes to its distributed.scheduler.http.routes "
                        "(docs/howto/dashboard.md)")
    finally:
        cluster.close()


# the page itself, in Chromium


def _browser() -> str:
    try:
        chromium = shot.find_chromium()
    except shot.ScreenshotError as exc:
        pytest.skip(str(exc))
    pytest.importorskip("playwright", reason="pip install -e '.[screenshot]'")
    return chromium


SNAPSHOT = """() => {
  const out = {};
  for (const tr of document.querySelectorAll("#runs tbody tr")) {
    const cells = {}, parts = {};
    for (const td of tr.querySelectorAll("td[data-field]"))
      cells[td.dataset.field] = td.textContent;
    for (const r of tr.querySelectorAll("rect[data-field]"))
      parts[r.dataset.field] = Number(r.dataset.value);
    out[tr.dataset.run] = {cells, parts};
  }
  return out;
}"""
"""What the page's table shows, in one read: run id -> its cells' text and time parts."""


def _shown(text: str) -> float | None:
    """A number as the page prints it (``"12 / 40"``: the first)."""
    first = text.split(" ")[0]
    return None if first == "–" else float(first)


def _matches(snapshot: dict[str, Any], row: dict[str, str]) -> None:
    for column in SHOWN:
        if column in row:
            assert _close(_shown(snapshot["cells"][column]), row[column]), (column, snapshot,
                                                                             row)
    for column, value in snapshot["parts"].items():
        assert _close(value, row[column]), (column, value, row[column])
    assert set(snapshot["parts"]) == {c for c in row if c.startswith("time/")
                                      and c != "time/iteration_s" and row[c] != ""}


def _page(pw: Any, chromium: str) -> Any:
    browser = pw.chromium.launch(executable_path=chromium, args=[
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"])
    return browser, browser.new_page(viewport={"width": 1400, "height": 900})


def test_the_page_shows_each_run_as_metrics_csv_has_it(two_runs, tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = _browser()
    base = _base(two_runs["client"])
    with sync_playwright() as pw:
        browser, page = _page(pw, chromium)
        try:
            page.goto(f"{base}/daskrl", timeout=30_000)
            page.wait_for_function("() => document.querySelectorAll('#runs tbody tr')"
                                   ".length === 2", timeout=15_000)
            page.wait_for_selector("svg[data-chart=episode_return_mean] circle[data-eval]")
            shown = page.evaluate(SNAPSHOT)
            page.screenshot(path=str(tmp_path / "two-runs.png"))
        finally:
            browser.close()
    for out in two_runs["outs"]:
        run = _board_run(base, out)
        last = [r for r in _rows(out) if r["iteration"]][-1]
        _matches(shown[run["run"]], last)
        assert shown[run["run"]]["cells"]["status"] == "finished"


def test_a_live_run_shows_its_latest_return_within_5_s_of_metrics_csv(tmp_path):
    """The embedded cluster of ``daskrl train``: the page shows each new metrics.csv row's
    iteration and return within 5 s of the row's write (the file's mtime)."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    chromium = _browser()
    out = tmp_path / "live"
    args = [str(REPO / "graphs" / "ppo.py"), "--no-eval", "--steps", "100000000",
            "--num-actors", "1", "--num-envs", "4", "--num-steps", "64", "--workers", "1"]
    delays = []
    with shot.TrainingRun(args, out=out) as run, sync_playwright() as pw:
        base = run.dashboard(timeout=120)
        browser, page = _page(pw, chromium)
        try:
            page.goto(f"{base}/daskrl?every=0.5", timeout=60_000)
            page.wait_for_selector("#runs tbody tr", timeout=120_000)
            # rows written from now on: those before were written while Chromium started
            seen = max((int(r["iteration"]) for r in _rows(out)), default=0)
            while len(delays) < 5:
                assert run.proc.poll() is None, "\n".join(run.lines)
                rows = _rows(out)
                if not rows or int(rows[-1]["iteration"]) <= seen:
                    time.sleep(0.01)
                    continue
                written = (out / "metrics.csv").stat().st_mtime
                seen = int(rows[-1]["iteration"])
                try:
                    page.wait_for_function(
                        "k => { const c = document.querySelector('td[data-field=iteration]');"
                        " return c && Number(c.dataset.value) >= k; }", arg=seen,
                        timeout=5_000, polling=20)
                except PlaywrightError:
                    pytest.fail(f"the page did not show iteration {seen} within 5 s of "
                                f"metrics.csv getting it (earlier rows: {delays})")
                delays.append((seen, time.time() - written))
            shown = next(iter(page.evaluate(SNAPSHOT).values()))
            page.screenshot(path=str(tmp_path / "live.png"))
        finally:
            browser.close()
        assert run.proc.poll() is None  # still training while the page was read
    rows = {r["iteration"]: r for r in _rows(out)}
    _matches(shown, rows[shown["cells"]["iteration"].split(" ")[0]])
    print("page delay after metrics.csv, s: "
          + ", ".join(f"it {it}: {d:.2f}" for it, d in delays))
    assert max(d for _, d in delays) < 5.0, delays
