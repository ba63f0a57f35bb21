"""A sweep on the dashboard's daskrl page: its table of trials as the board keeps it, in
``runs.json``, as the ``daskrl_sweep_trials`` gauge on ``/metrics``, and in the page's
Sweeps section in a real headless Chromium (that test skips, saying why, where Chromium or
playwright is not installed: ``apt-get install chromium`` and
``pip install -e '.[screenshot]'``)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from script_loader import EXAMPLES, load

from daskrl.observe.board import TOPIC, TRIAL_STATES, Board, board_settings
from daskrl.observe.board_feed import sweep_message
from daskrl.observe.board_plugin import RunBoard

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(180)


# its Chromium lookup, as tests/test_board.py uses it
shot = load(EXAMPLES / "dashboard_screenshot.py", "dashboard_screenshot")


def _trials(states: list[str]) -> list[dict[str, Any]]:
    """A grid's trials in ``states``, with the odd values a sweep has: numpy's scalars, a
    NaN return (no episode ended yet), no eval return, no run id before the start."""
    return [{"name": f"t{i:03d}-lr={lr:g}-seed=1", "state": state,
             "env_steps": np.int64(512 * i), "steps": 4096,
             "return": float("nan") if i == 0 else np.float32(10.5 + i),
             "eval_return": None if i % 2 else 20.25 + i,
             "run": None if state == "pending" else f"run{i:04d}"}
            for i, (lr, state) in enumerate(zip((0.1, 0.01, 0.001, 3e-4, 1e-4), states,
                                                strict=False))]


META = {"name": "lr-grid", "out": "/runs/lr-grid", "mode": "grid"}


def test_the_board_keeps_each_sweeps_latest_table_for_at_most_max_runs_sweeps():
    board = Board(max_runs=3)
    board.take({"kind": "start", "run": "r0", "name": "ppo-1"})
    board.take(sweep_message("s0", META, _trials(["running", "pending"])))
    last = sweep_message("s0", META, _trials(["finished", "running", "pending"]))
    board.take(last)
    (kept,) = board.as_json()["sweeps"]
    assert kept["trials"] == last["trials"] and kept["updated"] == last["updated"]
    assert (kept["sweep"], kept["name"], kept["mode"]) == ("s0", "lr-grid", "grid")
    assert [t["state"] for t in kept["trials"]] == ["finished", "running", "pending"]
    assert kept["trials"][0]["return"] is None and kept["trials"][1]["return"] == 11.5
    assert json.loads(board.as_text())["sweeps"] == [kept]  # no NaN: valid JSON
    assert [r["run"] for r in board.as_json()["runs"]] == ["r0"]  # runs as before
    # a message made without sweep_message is cleaned where the board takes it
    board.take({"kind": "sweep", "sweep": "raw",
                "trials": [{"state": "running", "return": float("inf")}]})
    assert json.loads(board.as_text())["sweeps"][0]["trials"] == [{"state": "running",
                                                                   "return": None}]
    for bad in ({"kind": "sweep", "trials": []}, {"kind": "sweep", "sweep": "x"},
                {"kind": "sweep", "sweep": "x", "trials": ["t000"]}):
        board.take(bad)
    assert board.ignored == 3 and sorted(board.sweeps) == ["raw", "s0"]
    board.take(sweep_message("s1", META, _trials(["running"])))
    board.take(sweep_message("s0", META, _trials(["finished", "finished"])))  # s0 ended
    board.take(sweep_message("s2", META, _trials(["running"])))
    # four sweeps, three kept: the ended one goes first, though heard from last
    assert [s["sweep"] for s in board.as_json()["sweeps"]] == ["s2", "s1", "raw"]
    board.take(sweep_message("s3", META, _trials(["pending"])))
    assert [s["sweep"] for s in board.as_json()["sweeps"]] == ["s3", "s2", "s1"]
    assert len(board.runs) == 1


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def _base(client: Client) -> str:
    """The dashboard's address, e.g. ``http://127.0.0.1:8787``."""
    return client.dashboard_link.rsplit("/", 1)[0]


@pytest.fixture(scope="module")
def scheduler() -> Iterator[Client]:
    """A LocalCluster's scheduler serving the page (its route module added to Dask's
    routes, as tests/test_board.py's user scheduler does) with the board plugin a daskrl
    driver registers; no workers: a sweep's messages are scheduler events."""
    routes = board_settings(dask.config.get("distributed.scheduler.http.routes"))
    with dask.config.set(routes):
        cluster = LocalCluster(n_workers=0, processes=False, protocol="tcp://",
                               host="127.0.0.1", dashboard_address="127.0.0.1:0")
    client = Client(cluster)
    try:
        client.register_plugin(RunBoard())
        yield client
    finally:
        client.close()
        cluster.close()


def _board_sweep(base: str, sweep: str) -> dict[str, Any]:
    sweeps = json.loads(_get(f"{base}/daskrl/runs.json"))["board"]["sweeps"]
    mine = [s for s in sweeps if s["sweep"] == sweep]
    assert len(mine) == 1, sweeps
    return mine[0]


def _expected(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the board should hold for ``trials`` (:func:`_trials`): plain numbers, no NaN."""
    return [{**t, "env_steps": int(t["env_steps"]),
             "return": None if isinstance(t["return"], float) and np.isnan(t["return"])
             else float(t["return"])} for t in trials]


def test_a_sweep_event_is_in_runs_json_and_its_trial_counts_on_metrics(scheduler):
    from prometheus_client.parser import text_string_to_metric_families

    base = _base(scheduler)
    scheduler.log_event(TOPIC, sweep_message("grid-b", META, _trials(["pending"] * 4)))
    trials = _trials(["running", "finished", "finished", "failed", "pending"])
    scheduler.log_event(TOPIC, sweep_message("grid-b", {**META, "name": "lr-grid-b"},
                                             trials))
    shown = _board_sweep(base, "grid-b")
    assert (shown["kind"], shown["name"], shown["out"], shown["mode"]) == (
        "sweep", "lr-grid-b", "/runs/lr-grid", "grid")
    assert shown["trials"] == _expected(trials)
    samples = {(s.labels["name"], s.labels["state"]): s.value
               for family in text_string_to_metric_families(_get(f"{base}/metrics"))
               for s in family.samples
               if s.name == "daskrl_sweep_trials" and s.labels["sweep"] == "grid-b"}
    counts = {**dict.fromkeys(TRIAL_STATES, 0.0), "running": 1.0, "finished": 2.0,
              "failed": 1.0, "pending": 1.0}
    assert samples == {("lr-grid-b", state): n for state, n in counts.items()}


# the page itself, in Chromium


def _browser() -> str:
    try:
        chromium = shot.find_chromium()
    except shot.ScreenshotError as exc:
        pytest.skip(str(exc))
    pytest.importorskip("playwright", reason="pip install -e '.[screenshot]'")
    return chromium


SWEEPS = """() => {
  const out = {};
  for (const box of document.querySelectorAll("#sweeps [data-sweep]")) {
    const field = name => box.querySelector(`h3 [data-field=${name}], p [data-field=${name}]`);
    const trials = [];
    for (const tr of box.querySelectorAll("tbody tr")) {
      const cells = {};
      for (const td of tr.querySelectorAll("td[data-field]"))
        cells[td.dataset.field] = td.textContent;
      trials.push(cells);
    }
    out[box.dataset.sweep] = {name: field("name").textContent, mode: field("mode").textContent,
                              counts: field("counts").textContent, trials,
                              visible: box.checkVisibility()};
  }
  return out;
}"""
"""What the page's Sweeps section shows, in one read: sweep id -> its title, counts line and
each trial row's cells."""


def test_the_page_shows_each_trials_name_and_state_live(scheduler, tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = _browser()
    base = _base(scheduler)
    trials = _trials(["running", "finished", "pending"])
    scheduler.log_event(TOPIC, sweep_message("grid-c", {**META, "name": "lr-grid-c"}, trials))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{base}/daskrl?every=0.3", timeout=30_000)
            page.wait_for_selector("[data-sweep=grid-c] tbody tr", timeout=15_000)
            first = page.evaluate(SWEEPS)["grid-c"]
            # the next table replaces this one on the page, with the rest of the page's poll
            trials[2]["state"], trials[0]["state"] = "running", "pruned"
            scheduler.log_event(TOPIC, sweep_message("grid-c", {**META, "name": "lr-grid-c"},
                                                     trials))
            page.wait_for_function("() => document.querySelector("
                                   "'[data-sweep=grid-c] [data-trial^=t002] "
                                   "[data-field=state]').textContent === 'running'",
                                   timeout=10_000)
            second = page.evaluate(SWEEPS)["grid-c"]
            page.screenshot(path=str(tmp_path / "sweeps.png"))
        finally:
            browser.close()
    assert first["visible"] and (first["name"], first["mode"]) == ("lr-grid-c", "grid")
    assert first["counts"] == "3 trials: 1 running, 1 finished, 1 pending"
    assert [(t["trial"], t["state"]) for t in first["trials"]] == [
        ("t000-lr=0.1-seed=1", "running"), ("t001-lr=0.01-seed=1", "finished"),
        ("t002-lr=0.001-seed=1", "pending")]
    assert [t["env_steps"] for t in first["trials"]] == [
        "0 / 4096 (0%)", "512 / 4096 (12%)", "1024 / 4096 (25%)"]
    assert [(t["return"], t["eval_return"], t["run"]) for t in first["trials"]] == [
        ("–", "20.25", "run0000"), ("11.5", "–", "run0001"), ("12.5", "22.25", "–")]
    assert second["counts"] == "3 trials: 1 running, 1 finished, 1 pruned"
    assert [(t["trial"], t["state"]) for t in second["trials"]] == [
        (t["name"], t["state"]) for t in trials]
