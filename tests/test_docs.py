"""The documentation's code runs as written: every code block of ``docs/`` is run here (class
``ci-run``), by a test that names it (class ``ci-test``), or says why not in a caption the
reader sees (``Not run in CI: <why>``); output and listings are ``text``. The Sphinx build
(``docs/_ext/daskrl_docs.py``) refuses an unmarked block too; this test runs without Sphinx.

Each page's ``ci-run`` blocks run in order in a scratch folder of their own (``graphs/`` and
``examples/`` linked in, as in a checkout), shell blocks with ``bash -euo pipefail``, Python
blocks with this interpreter, and must exit 0. A block of class ``needs-X`` skips, saying why,
when the module ``X`` is missing (``needs-graphviz``: also Debian's ``dot``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
GENERATED = {"reference/graph-settings.md", "reference/api.rst"}  # written by the build
OUTPUT = {"text", "none", ""}
NOT_RUN = re.compile(r"^Not run in CI\b[^:]*: \S.{8,}")
_OPEN = re.compile(r"^(`{3,}|~{3,})\s*(\{([\w-]+)\})?\s*(.*?)\s*$")


@dataclass
class Block:
    """One code block of a page: its language, directive options and text."""

    page: str
    line: int
    language: str
    options: dict[str, str] = field(default_factory=dict)
    text: str = ""

    @property
    def classes(self) -> set[str]:
        return set(self.options.get("class", "").split())

    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def pages() -> list[str]:
    """The markdown pages of the site that are kept in git (not the generated ones)."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        rel = path.relative_to(DOCS).as_posix()
        if rel.startswith("_build/") or rel in GENERATED:
            continue
        if rel.startswith("benchmarks/") and rel != "benchmarks/index.md":
            continue  # written from benchmarks/*.md, each command captioned as not run
        found.append(rel)
    return found


def blocks(page: str) -> list[Block]:
    """The code blocks of ``docs/<page>``: plain fences, ``{code-block}``/``{code}`` and
    ``{literalinclude}`` directives (other directives hold no code)."""
    lines = (DOCS / page).read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        match = _OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        fence, _, directive, argument = match.groups()
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        if directive in (None, "code-block", "code", "code-cell", "sourcecode"):
            language = argument.split()[0] if argument else ""
        elif directive == "literalinclude":
            language = "literalinclude"
        else:
            continue  # toctree, argparse, ...
        options: dict[str, str] = {}
        while directive and body and body[0].startswith(":"):
            key, _, value = body.pop(0)[1:].partition(":")
            options[key.strip()] = value.strip().strip('"')
        if directive == "literalinclude":
            options.setdefault("language", options.get("language", ""))
        out.append(Block(page, start + 1, language, options, "\n".join(body).strip("\n")))
    return out


def block_named(page: str, name: str) -> str:
    """The text of the block with ``:name: <name>`` on ``docs/<page>`` (for ``ci-test``)."""
    for block in blocks(page):
        if block.options.get("name") == name:
            return block.text + "\n"
    raise LookupError(f"docs/{page} has no block named {name!r}")


ALL = [b for p in pages() for b in blocks(p)]


def test_the_site_has_pages_and_code():
    assert {"index.md", "getting-started.md", "howto/own-graph.md"} <= set(pages())
    assert sum("ci-run" in b.classes for b in ALL) >= 10


@pytest.mark.parametrize("block", ALL, ids=Block.where)
def test_every_block_is_run_or_says_why_not(block):
    if block.language in OUTPUT or block.classes & {"ci-run", "ci-test"}:
        return
    caption = block.options.get("caption", "")
    assert NOT_RUN.match(caption), (
        f"{block.where()}: a {block.language} block that CI neither runs nor marks: give it "
        ":class: ci-run, :class: ci-test with a :name: a test uses, or "
        ':caption: "Not run in CI: <why>"')


def test_each_ci_test_block_is_named_by_a_test():
    tests = {p: p.read_text() for p in (REPO / "tests").glob("test_*.py")}
    for block in (b for b in ALL if "ci-test" in b.classes):
        name = block.options.get("name")
        assert name, f"{block.where()}: a ci-test block needs a :name: for its test to use"
        users = [p.name for p, text in tests.items()
                 if f'"{block.page}", "{name}"' in text]
        assert users, f"{block.where()}: no test reads block {name!r} (block_named)"


def _shims(folder: Path) -> dict[str, str]:
    """An environment whose ``python`` and ``daskrl`` are this interpreter's."""
    bin_dir = folder / ".bin"
    bin_dir.mkdir()
    for name, command in (("python", f'"{sys.executable}"'),
                          ("daskrl", f'"{sys.executable}" -m daskrl.cli')):
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\nexec {command} \"$@\"\n")
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["MPLBACKEND"] = "Agg"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
    return env


def _missing(block: Block) -> str | None:
    for cls in sorted(block.classes):
        if not cls.startswith("needs-"):
            continue
        module = cls.removeprefix("needs-")
        if importlib.util.find_spec(module) is None:
            return f"{block.where()} needs {module}: pip install -e '.[docs,notebook,graph]'"
        if module == "graphviz" and shutil.which("dot") is None:
            return f"{block.where()} needs Debian's graphviz (dot): apt-get install graphviz"
    return None


RUN_PAGES = sorted({b.page for b in ALL if "ci-run" in b.classes})


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_page_runs_as_written(page, tmp_path):
    for name in ("graphs", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    env = _shims(tmp_path)
    for block in (b for b in blocks(page) if "ci-run" in b.classes):
        missing = _missing(block)
        if missing:
            pytest.skip(missing)
        if block.language in ("bash", "sh", "shell", "console"):
            command = ["bash", "-euo", "pipefail", "-c", block.text]
        elif block.language == "python":
            command = [sys.executable, "-c", block.text]
        else:
            raise AssertionError(f"{block.where()}: ci-run runs bash or python, not "
                                 f"{block.language}")
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, (
            f"{block.where()} exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
            f"\n--- stderr\n{proc.stderr[-3000:]}")


def test_the_readme_python_example_runs(tmp_path):
    """The README's example, which the getting-started page repeats, with fewer steps."""
    text = (REPO / "README.md").read_text()
    start = text.index("```python\n") + len("```python\n")
    code = text[start:text.index("\n```", start)] + "\n"
    assert code == block_named("getting-started.md", "readme-example"), (
        "README.md's Python example and docs/getting-started.md's copy differ: make them one")
    if importlib.util.find_spec("pandas") is None:
        pytest.skip("the README example reads Run.metrics: pip install -e '.[notebook]'")
    assert "steps=100_000" in code, "the README example's step count changed: update this test"
    code = code.replace("steps=100_000", "steps=4096").replace("num_envs=8", "num_envs=4")
    (tmp_path / "graphs").symlink_to(REPO / "graphs")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_shims(tmp_path),
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("http://127.0.0.1:"), proc.stdout  # the dashboard link


def test_the_notebook_is_kept_without_outputs():
    """examples/notebook.ipynb is run by CI (nbmake); kept clean, it diffs as code."""
    notebook = json.loads((REPO / "examples" / "notebook.ipynb").read_text())
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert code and all(not c.get("outputs") and c.get("execution_count") is None
                        for c in code)
    source = "".join("".join(c["source"]) for c in code)
    assert "wait=False" in source and ".metrics" in source and "policy" in source
