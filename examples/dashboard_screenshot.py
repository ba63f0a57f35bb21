"""Screenshots of the Dask dashboard while daskrl trains, taken with headless Chromium.

Run (the pictures in ``docs/dashboard/`` were taken this way)::

    pip install -e ".[screenshot]"         # playwright from PyPI; it drives your own Chromium
    apt-get install chromium               # if missing (or pass --chromium PATH)
    python examples/dashboard_screenshot.py                 # a short PPO run, embedded cluster
    python examples/dashboard_screenshot.py -- --distribution central-inference --num-steps 16
    python examples/dashboard_screenshot.py --dashboard http://127.0.0.1:8787   # a busy cluster

Without ``--dashboard`` it starts ``daskrl train GRAPH --no-progress ARGS`` (ARGS: whatever
follows ``--``), reads the dashboard address the run prints, lets it train ``--wait`` seconds,
photographs each page and stops the run with Ctrl-C (SIGINT). With ``--dashboard`` it only
photographs that dashboard; something should be computing there.

Bokeh draws the dashboard in the browser, after the page has loaded, from data that comes over
a websocket, so ``chromium --headless --screenshot`` (even with ``--virtual-time-budget``)
captures an empty page. This script drives Chromium over the DevTools protocol (playwright,
with ``executable_path`` set to the system Chromium: no browser download) and takes each
picture only once the page's Bokeh views have finished rendering and one of its data sources
holds visible rows (task rectangles, graph nodes), plus ``--settle`` seconds for the redraw.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PAGES = {
    "status": "/status",
    "task-stream": "/individual-task-stream",
    "graph": "/graph",
    "progress": "/individual-progress",
    "workers": "/workers",
    "rl": "/daskrl",
}
"""Picture name -> dashboard path (``rl``: daskrl's own page, ``docs/howto/dashboard.md``)."""

DRAWN = """() => {
  if (!window.Bokeh || !Bokeh.documents || Bokeh.documents.length === 0) return false;
  const views = Object.values(Bokeh.index || {});
  if (views.length === 0 || !views.every(v => !v.has_finished || v.has_finished())) return false;
  for (const doc of Bokeh.documents) {
    for (const m of doc.all_models) {
      if (m.type !== "ColumnDataSource" || m.get_length() === 0) continue;
      const visible = m.data["visible"];
      if (!visible || Array.from(visible).some(v => v === "True" || v === true)) return true;
    }
  }
  return false;
}"""
"""True once every Bokeh root view has rendered and a data source has visible rows."""

CHARTED = """() => document.querySelector("#runs tbody tr") !== null
  && document.querySelector("svg[data-chart] polyline") !== null"""
"""True once daskrl's page (not a Bokeh one) shows a run and its curves."""


class ScreenshotError(RuntimeError):
    """A problem the user can fix; its message says what and how."""


def find_chromium(path: str | None = None) -> str:
    """The Chromium executable: ``path``, ``$CHROMIUM``, or the first one on ``PATH``.

    Raises
    ------
    ScreenshotError
        Naming what was looked for and how to install it.

    Examples
    --------
    >>> find_chromium("/usr/bin/chromium")  # doctest: +SKIP
    '/usr/bin/chromium'
    """
    wanted = path or os.environ.get("CHROMIUM")
    if wanted:
        found = shutil.which(wanted)
        if found is None:
            raise ScreenshotError(f"chromium {wanted!r} is not an executable file: install it "
                                  "(apt-get install chromium) or pass --chromium PATH")
        return found
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    raise ScreenshotError("no chromium on PATH (looked for chromium, chromium-browser, "
                          "google-chrome): install it (apt-get install chromium) or pass "
                          "--chromium PATH")


class TrainingRun:
    """``daskrl train`` as a child process whose stderr is drained (and kept, last 50 lines).

    Examples
    --------
    >>> with TrainingRun(["graphs/ppo.py"]) as run:  # doctest: +SKIP
    ...     print(run.dashboard(timeout=120))
    http://127.0.0.1:40529
    """

    def __init__(self, args: Sequence[str], out: Path | None = None) -> None:
        self._tmp = None if out is not None else tempfile.mkdtemp(prefix="daskrl-dashboard-")
        self.out = out or Path(self._tmp) / "run"
        cmd = [sys.executable, "-m", "daskrl.cli", "train", *args, "--no-progress",
               "--out", str(self.out)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, cwd=REPO)
        self.lines: deque[str] = deque(maxlen=50)
        self._address: str | None = None
        self._seen = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            found = re.search(r"dashboard: (https?://[^/\s]+)", line)
            if found and self._address is None:
                self._address = found.group(1)
                self._seen.set()
        self._seen.set()

    def dashboard(self, timeout: float) -> str:
        """The dashboard's base address, once the run has printed it."""
        if not self._seen.wait(timeout) or self._address is None:
            why = "ended" if self.proc.poll() is not None else f"printed none within {timeout:g}s"
            tail = "\n".join(list(self.lines)[-10:])
            raise ScreenshotError(f"the training run {why} (no 'dashboard:' line):\n{tail}")
        return self._address

    def stop(self, timeout: float = 30) -> None:
        """Ctrl-C the run (it checkpoints and cancels its work), then kill it if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def take_screenshots(dashboard: str, pages: Sequence[str], out_dir: Path, chromium: str,
                     width: int = 1400, height: int = 900, timeout: float = 60,
                     settle: float = 2.0) -> list[Path]:
    """Photograph each of ``pages`` (keys of :data:`PAGES`) of the dashboard at ``dashboard``.

    Each picture is taken once the page's plots have drawn data (see :data:`DRAWN`, and
    :data:`CHARTED` for daskrl's page).

    Raises
    ------
    ScreenshotError
        When playwright is missing, Chromium does not start, or a page draws no data within
        ``timeout`` seconds.

    Examples
    --------
    >>> take_screenshots("http://127.0.0.1:8787", ["task-stream"], Path("docs/dashboard"),
    ...                  "/usr/bin/chromium")  # doctest: +SKIP
    [PosixPath('docs/dashboard/task-stream.png')]
    """
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise ScreenshotError("playwright is not installed: pip install -e '.[screenshot]' "
                              "(it drives the system chromium; no browser download)") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=chromium, timeout=timeout * 1000)
        except PlaywrightError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise ScreenshotError(f"chromium {chromium} did not start: {first}") from None
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            for name in pages:
                url = dashboard.rstrip("/") + PAGES[name]
                try:
                    page.goto(url, timeout=timeout * 1000)
                    ready = CHARTED if name == "rl" else DRAWN
                    page.wait_for_function(ready, timeout=timeout * 1000, polling=250)
                except PlaywrightError as exc:
                    first = str(exc).strip().splitlines()[0]
                    hint = (" (the graph page stays empty while the scheduler holds more than "
                            "distributed.dashboard.graph-max-items tasks, 5000 by default)"
                            if PAGES[name] == "/graph" else "")
                    raise ScreenshotError(
                        f"{url}: no plot drew data within {timeout:g}s ({first}); is something "
                        f"computing on that cluster?{hint}") from None
                time.sleep(settle)  # let the periodic callbacks redraw with the new data
                path = out_dir / f"{name}.png"
                page.screenshot(path=str(path))
                written.append(path)
                print(f"wrote {path}", file=sys.stderr)
        finally:
            browser.close()
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; ``python examples/dashboard_screenshot.py --help`` lists the options.

    Returns 0, or 2 after printing one line that names the problem and its fix.

    Examples
    --------
    >>> main(["--pages", "task-stream", "--out", "shots", "--", "--num-actors", "2"])
    ... # doctest: +SKIP
    0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Arguments after -- go to `daskrl train`.")
    parser.add_argument("--dashboard", default=None, metavar="URL",
                        help="photograph this dashboard (e.g. http://127.0.0.1:8787) instead of "
                             "starting a training run")
    parser.add_argument("--graph", default=str(REPO / "graphs" / "ppo.py"),
                        help="graph script to train (default: graphs/ppo.py)")
    parser.add_argument("--pages", default="status,task-stream,graph",
                        help=f"comma-separated, from {', '.join(PAGES)}")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard",
                        help="folder for the PNGs (default: docs/dashboard)")
    parser.add_argument("--chromium", default=None,
                        help="Chromium executable (default: $CHROMIUM or chromium on PATH)")
    parser.add_argument("--wait", type=float, default=15.0,
                        help="seconds of training before the first picture")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds between a page's first drawn data and its picture")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for the dashboard address and for each page")
    parser.add_argument("--size", default="1400x900", help="browser window, WIDTHxHEIGHT")
    args = parser.parse_args(own)
    pages = [p.strip() for p in args.pages.split(",") if p.strip()]
    try:
        unknown = [p for p in pages if p not in PAGES]
        if unknown or not pages:
            raise ScreenshotError(f"--pages {args.pages!r}: choose from {', '.join(PAGES)}")
        if not re.fullmatch(r"\d+x\d+", args.size):
            raise ScreenshotError(f"--size {args.size!r}: write WIDTHxHEIGHT, e.g. 1400x900")
        width, height = (int(v) for v in args.size.split("x"))
        chromium = find_chromium(args.chromium)
        shoot = dict(pages=pages, out_dir=args.out, chromium=chromium, width=width,
                     height=height, timeout=args.timeout, settle=args.settle)
        if args.dashboard:
            take_screenshots(args.dashboard, **shoot)
            return 0
        with TrainingRun([args.graph, "--no-eval", "--steps", "100000000", *train_args]) as run:
            address = run.dashboard(args.timeout)
            print(f"training; dashboard {address}", file=sys.stderr)
            time.sleep(args.wait)
            if run.proc.poll() is not None:
                tail = "\n".join(list(run.lines)[-10:])
                raise ScreenshotError(f"the training run ended before the pictures:\n{tail}")
            take_screenshots(address, **shoot)
    except ScreenshotError as exc:
        print(f"dashboard_screenshot: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
